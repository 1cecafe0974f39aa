#!/usr/bin/env bash
# Builds what the harness' real nodes run: kubelet, containerd (+ ctr, containerd-shim-runc-v2),
# runc, our own pause image and a tiny probe image (OCI archives under images/), and a copy of
# the CNI plugins (Debian's containernetworking-plugins), into a cache keyed by the versions pinned
# in versions.env. Only what is missing is built; the directory appears whole or not at all
# (everything is built into a .partial dir first). Progress goes to stderr; the last line of
# stdout is the directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"

binaries=(kubelet containerd ctr containerd-shim-runc-v2 runc pause probe)
cni_plugins=(bridge host-local loopback portmap)
pause_tag=${PAUSE_IMAGE##*:}

cache=${LJ_RUNTIMEKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lj-runtimekit}
key="node-${KUBERNETES_VERSION}_containerd-${CONTAINERD_VERSION}_runc-${RUNC_VERSION}_pause-${pause_tag}"
out="$cache/node/$key"

complete() {
  local dir=$1 b
  for b in "${binaries[@]}"; do [[ -x "$dir/bin/$b" ]] || return 1; done
  for b in "${cni_plugins[@]}"; do [[ -x "$dir/cni/$b" ]] || return 1; done
  [[ -s "$dir/images/pause.oci.tar" && -s "$dir/images/probe.oci.tar" ]]
}

if complete "$out"; then
  echo "$out"
  exit 0
fi

# One build of this entry at a time (make test's phases, a demo or a second clone beside it): the
# second waits for the first, then finds the result.
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
if complete "$out"; then echo "$out"; exit 0; fi

command -v go >/dev/null || { echo "go not found: the node binaries are built with the Go toolchain" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 not found: it writes the pause image archive" >&2; exit 1; }
proxy=${GOPROXY:-$(go env GOPROXY)}
proxy=${proxy%%,*}
work="$cache/node/src-$key"
partial="$out.partial"
mkdir -p "$work"
export GOFLAGS=-buildvcs=false

# An interrupted earlier run may have left a .partial dir; start it over, keeping what the final
# dir already has (a rerun after adding one binary builds only that one).
rm -rf "$partial"
mkdir -p "$partial/bin" "$partial/cni" "$partial/images"
if [[ -d "$out" ]]; then cp -a "$out/." "$partial/"; fi
missing() { [[ ! -x "$partial/bin/$1" ]]; }
step() { echo "[node-binaries] $*" >&2; }
# Runs a chatty command quietly; its output goes to stderr only when it fails.
quiet() {
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  if (( rc != 0 )); then printf '%s\n' "$out" >&2; echo "[node-binaries] failed ($rc): $*" >&2; fi
  return "$rc"
}
timed() { local t=$SECONDS; "$@"; step "$1 done in $(( SECONDS - t )) s"; }

build_kubelet() {
  local dir="$work/kubelet" k8s_minor=${KUBERNETES_VERSION#v1.} staging="v0.${KUBERNETES_VERSION#v1.}"
  k8s_minor=${k8s_minor%%.*}
  mkdir -p "$dir" && cd "$dir"
  step "kubelet $KUBERNETES_VERSION (CGO_ENABLED=0)"
  curl -fsSL "$proxy/k8s.io/kubernetes/@v/$KUBERNETES_VERSION.mod" -o upstream.mod
  # As build-binaries.sh: k8s.io/kubernetes' staging modules are pinned to their published tags.
  {
    echo "module ljrk.invalid/kubelet"
    echo
    echo "go $(awk '$1=="go"{print $2; exit}' upstream.mod)"
    echo
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    echo
    awk '$2=="v0.0.0" && $1 ~ /^k8s\.io\// {print "replace " $1 " => " $1 " '"$staging"'"}' upstream.mod | sort -u
  } > go.mod
  printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kubelet"\n' > tools.go
  go mod tidy -e >/dev/null 2>&1 || true
  local pkg=k8s.io/component-base/version
  local ld="-s -w -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  quiet go get "k8s.io/kubernetes/cmd/kubelet@$KUBERNETES_VERSION"
  CGO_ENABLED=0 go build -tags tools -trimpath -ldflags "$ld" -o "$partial/bin/kubelet" k8s.io/kubernetes/cmd/kubelet
}

build_containerd() {
  local dir="$work/containerd" mod=github.com/containerd/containerd/v2
  mkdir -p "$dir" && cd "$dir"
  step "containerd $CONTAINERD_VERSION + ctr + containerd-shim-runc-v2 (CGO_ENABLED=0)"
  printf 'module ljrk.invalid/containerd\n\ngo 1.24\n' > go.mod
  # `go get` each command, not only the module root: their own dependencies come with them.
  quiet go get "$mod/cmd/containerd@$CONTAINERD_VERSION" "$mod/cmd/ctr@$CONTAINERD_VERSION" \
    "$mod/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
  local ld="-s -w -X $mod/version.Version=$CONTAINERD_VERSION -X $mod/version.Package=$mod -X $mod/version.Revision=ljrk"
  CGO_ENABLED=0 go build -trimpath -tags "no_btrfs no_devmapper no_zfs" -ldflags "$ld" \
    -o "$partial/bin/" "$mod/cmd/containerd" "$mod/cmd/ctr" "$mod/cmd/containerd-shim-runc-v2"
}

build_runc() {
  local dir="$work/runc"
  mkdir -p "$dir" && cd "$dir"
  step "runc $RUNC_VERSION (cgo, seccomp)"
  if ! pkg-config --exists libseccomp 2>/dev/null && [[ ! -e /usr/include/seccomp.h ]]; then
    step "libseccomp-dev missing: apt-get install -y libseccomp-dev"
    # a fresh machine may have no package lists yet
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libseccomp-dev >&2
  fi
  printf 'module ljrk.invalid/runc\n\ngo 1.24\n' > go.mod
  quiet go get "github.com/opencontainers/runc@$RUNC_VERSION"
  CGO_ENABLED=1 go build -trimpath -tags seccomp -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" \
    -o "$partial/bin/runc" github.com/opencontainers/runc
}

build_images() {
  local name
  for name in pause probe; do
    if missing "$name"; then
      step "$name (static Go)"
      local dir="$work/$name"
      mkdir -p "$dir" && cp "$here/node-images/$name/main.go" "$dir/" && cd "$dir"
      printf 'module ljrk.invalid/%s\n\ngo 1.24\n' "$name" > go.mod
      CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$partial/bin/$name" .
    fi
  done
  python3 "$here/oci-image.py" --name "$PAUSE_IMAGE" --out "$partial/images/pause.oci.tar" \
    --entrypoint /pause --file "$partial/bin/pause=/pause"
  python3 "$here/oci-image.py" --name "localhost/lj-runtimekit/probe:v1" \
    --out "$partial/images/probe.oci.tar" --entrypoint /probe --file "$partial/bin/probe=/probe"
}

copy_cni() {
  local src=/usr/lib/cni p
  if [[ ! -x "$src/bridge" ]]; then
    step "CNI plugins: Debian's containernetworking-plugins unpacked into the cache (not installed)"
    local deb="$work/deb"
    mkdir -p "$deb"
    (cd "$deb" && { apt-get download containernetworking-plugins >&2 ||
      { apt-get update -qq >&2 && apt-get download containernetworking-plugins >&2; }; })
    dpkg -x "$deb"/containernetworking-plugins_*.deb "$deb/root"
    src="$deb/root/usr/lib/cni"
  fi
  for p in "${cni_plugins[@]}"; do cp -f "$src/$p" "$partial/cni/$p"; done
}

start=$SECONDS
step "building the missing node binaries into $out (first time only)"
# containerd and runc first: the kubelet shares most of its Go build cache with the control plane
# (build-binaries.sh), which may still be building when this script starts.
missing runc && timed build_runc
if missing containerd || missing ctr || missing containerd-shim-runc-v2; then timed build_containerd; fi
missing kubelet && timed build_kubelet
timed build_images
copy_cni
complete "$partial" || { echo "node binaries incomplete in $partial" >&2; exit 1; }
rm -rf "$out.old"
[[ -d "$out" ]] && mv "$out" "$out.old"
mv "$partial" "$out"
rm -rf "$out.old"
step "built in $(( SECONDS - start )) s"
echo "$out"
