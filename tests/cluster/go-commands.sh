# Sourced by the scripts that build pinned Go commands into the binary cache (build-registry.sh,
# ../images/build-buildkit.sh). The caller sets, before it calls `build`:
#   step_label  the prefix of its progress lines
#   work        the folder of the throwaway modules
#   out         the cache entry the binaries land in
#   partial     where a binary is linked before it moves into $out whole
step() { echo "[$step_label] $*" >&2; }

# Runs a chatty command quietly; its output goes to stderr only when it fails.
quiet() {
  local log rc=0
  log=$("$@" 2>&1) || rc=$?
  if (( rc != 0 )); then printf '%s\n' "$log" >&2; step "failed ($rc): $*"; fi
  return "$rc"
}

build() { # name package version ldflags
  local name=$1 pkg=$2 version=$3 ld=$4 dir="$work/$1-$3" t=$SECONDS
  [[ -x "$out/$name" ]] && return 0
  step "$name $version from $pkg"
  mkdir -p "$dir" && cd "$dir"
  # A throwaway main module requiring the pinned one: `go get` resolves the command's own
  # dependencies exactly as its go.mod pins them (GOTOOLCHAIN fetches a newer Go if it asks).
  printf 'module ljrk.invalid/%s\n\ngo 1.24\n' "$name" > go.mod
  quiet go get "$pkg@$version"
  go build -trimpath -ldflags "-s -w $ld" -o "$partial/$name" "$pkg"
  mkdir -p "$out"
  mv -f "$partial/$name" "$out/$name"
  step "$name built in $(( SECONDS - t )) s"
}
