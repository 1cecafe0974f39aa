#!/usr/bin/env bash
# `make images`: every component's image from its own Dockerfile with buildah — no Docker engine,
# no image registry. The tags and versions are docker-bake.hcl's (the file `make docker` builds
# from): each image is tagged as deploy/ expects and written as an OCI archive to
# $OUT/<component>.tar, with $OUT/index.json listing {component, image, archive, digest}.
# An image whose inputs (Dockerfile, build context, build args, base and uv images) did not change
# is not rebuilt: each built archive is also kept under the cache (~/.cache/lj-runtimekit/images/
# built/<component>-<inputs>.tar, the last two per component), so a fresh clone links it instead.
#
# Environment (the Makefile sets them):
#   REGISTRY            image registry/namespace (default: docker-bake.hcl's REGISTRY)
#   COMPONENTS          which images (default: all five)
#   <COMPONENT>_VERSION, lj_runtimekit_version   as for docker-bake.hcl; else v<pyproject version>
#   PYTHON_IMAGE, UV_IMAGE   a base/uv image from a mirror; default: made here (base-image.sh, and
#                       a uv image holding the pinned uv binary $UV)
#   UV                  the pinned uv binary (default .venv/bin/uv)
#   OUT                 where the archives go (default build/images)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"

# buildah only: debootstrap is base-image.sh's (once, and not with PYTHON_IMAGE); skopeo and
# podman are the bundle tests' (tests/bundle_tests/conftest.py).
"$here/install-tools.sh" buildah
BUILDAH=$here/buildah.sh
export BUILDAH
bake=docker-bake.hcl
all_components=(device-plugin scheduler exporter controller job-agent operator)
read -r -a components <<< "${COMPONENTS:-${all_components[*]}}"
out=${OUT:-build/images}
mkdir -p "$out"
total_start=$SECONDS
store=${LJ_RUNTIMEKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lj-runtimekit}/images/built
mkdir -p "$store"
# One build into $out at a time (a demo beside make test): the second waits, then finds them built.
exec 9>"$out/.build.lock"
flock 9

bake_default() { # the default of a docker-bake.hcl variable
  awk -v v="\"$1\"" '$1 == "variable" && $2 == v {f = 1} f && $1 == "default" {
    sub(/^[^=]*= */, ""); gsub(/"/, ""); print; exit}' "$bake"
}
bake_tag() { # the tag template of a docker-bake.hcl target
  awk -v t="\"$1\"" '$1 == "target" && $2 == t {f = 1} f && $1 == "tags" {
    sub(/^[^[]*\[ *"/, ""); sub(/" *\].*$/, ""); print; exit}' "$bake"
}
registry=${REGISTRY:-$(bake_default REGISTRY)}
source_label=$(sed -nE 's/^ *"org\.opencontainers\.image\.source" *= *"([^"]+)".*/\1/p' "$bake")

# The base image and the uv binary: a mirror's when given, else made here.
bases_line=$("$here/local-bases.sh" | tail -n1)
read -r python_image uv_image <<< "$bases_line"
image_id() { $BUILDAH inspect --type image --format '{{.FromImageID}}' "$1"; }
bases="$python_image=$(image_id "$python_image") $uv_image=$(image_id "$uv_image")"

# The build reaches PyPI with the CAs this machine trusts (a site's TLS-intercepting proxy CA is
# usually only there): its bundle is the Dockerfiles' secret "ca-certificates", mounted for the
# RUN that downloads, not copied into the image.
ca_bundle=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
trust=()
if [[ -f $ca_bundle ]]; then
  trust=(--secret "id=ca-certificates,src=$(readlink -f "$ca_bundle")"
    --build-arg SSL_CERT_FILE=/run/lj-runtimekit/ca-certificates.crt)
fi

# What an image is made of: its Dockerfile, args and bases, and the part of the build context it
# installs (the workspace's files, the interface package, its own component).
files_sum() {
  find "$@" -type f -not -path '*/__pycache__/*' -not -name '*.pyc' -not -path '*/.*_cache/*' \
    -not -path '*/.hypothesis/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-64
}
workspace_sum=$(files_sum pyproject.toml uv.lock proto tests/pyproject.toml components/*/pyproject.toml)

# An archive of $out into the cache (a copy: $out may be on another filesystem), keeping this one
# and the one before per component.
keep() { # component inputs-key
  cp "$out/$1.tar" "$store/.$1-$2.tar.partial" && mv "$store/.$1-$2.tar.partial" "$store/$1-$2.tar"
  cp "$out/$1.json" "$store/$1-$2.json"
  ls -t "$store/$1"-*.tar | tail -n +3 | while read -r old; do rm -f "$old" "${old%.tar}.json"; done
}

built=0
for c in "${components[@]}"; do
  var=$(echo "$c" | tr a-z- A-Z_)_VERSION
  version=${!var:-${lj_runtimekit_version:-v$(sed -nE 's/^version = "([^"]+)"/\1/p' "components/$c/pyproject.toml")}}
  template=$(bake_tag "$c")
  [[ -n $template ]] || { echo "docker-bake.hcl has no target $c" >&2; exit 1; }
  ref=${template//\$\{REGISTRY\}/$registry}
  ref=${ref//\$\{$var\}/$version}
  dockerfile=components/$c/Dockerfile
  key=$( { echo "$ref $bases $source_label $workspace_sum $(files_sum "components/$c")"
           cat "$dockerfile"; } | sha256sum | cut -c1-64)
  sidecar=$out/$c.json
  if [[ -f $out/$c.tar && -f $sidecar ]] && grep -q "\"inputs\": \"$key\"" "$sidecar"; then
    echo "== $c: up to date ($ref)" >&2
    [[ -f $store/$c-$key.tar ]] || keep "$c" "$key"
    continue
  fi
  if [[ -f $store/$c-$key.tar && -f $store/$c-$key.json ]]; then
    ln -f "$store/$c-$key.tar" "$out/$c.tar" 2>/dev/null || cp "$store/$c-$key.tar" "$out/$c.tar"
    cp "$store/$c-$key.json" "$sidecar"
    echo "== $c: from the cache ($ref, $store/$c-$key.tar)" >&2
    continue
  fi
  start=$SECONDS
  echo "== $c: building $ref" >&2
  log=$out/$c.build.log
  # The steps as they run; everything buildah says goes to the log.
  set +e
  $BUILDAH bud --pull=false --layers=false \
    --build-arg "PYTHON_IMAGE=$python_image" --build-arg "UV_IMAGE=$uv_image" "${trust[@]}" \
    --label "org.opencontainers.image.source=$source_label" \
    --label "org.opencontainers.image.version=$version" \
    -f "$dockerfile" -t "$ref" . < /dev/null 2>&1 | tee "$log" \
    | grep --line-buffered -E '^(\[[0-9]+/[0-9]+\] )?STEP [0-9]+/' | cut -c1-110 | sed 's/^/   /' >&2
  status=${PIPESTATUS[0]}
  set -e
  if ((status != 0)); then
    tail -n 40 "$log" >&2
    echo "== $c: build failed (whole log: $log)" >&2
    exit 1
  fi
  layout=$(mktemp -d "$out/.layout-$c.XXXXXX")
  $BUILDAH push --quiet "$ref" "oci:$layout" >/dev/null
  digest=$(python3 "$here/oci_archive.py" pack "$layout" "$ref" "$out/$c.tar")
  rm -rf "$layout"
  printf '{"component": "%s", "image": "%s", "digest": "%s", "inputs": "%s"}\n' \
    "$c" "$ref" "$digest" "$key" > "$sidecar"
  keep "$c" "$key"
  echo "== $c: built in $((SECONDS - start)) s, $(du -h "$out/$c.tar" | cut -f1) → $out/$c.tar ($digest)" >&2
  built=$((built + 1))
done
# Earlier builds of the same tags, now untagged, only take space.
((built == 0)) || $BUILDAH rmi --prune >/dev/null 2>&1 || true
python3 "$here/oci_archive.py" index "$out" "${all_components[@]}"
echo "== images: ${#components[@]} ready ($built built) in $((SECONDS - total_start)) s" >&2
