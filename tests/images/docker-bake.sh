#!/usr/bin/env bash
# `make docker` where no Docker engine is: `buildx bake` of docker-bake.hcl against a BuildKit
# daemon of our own (both built from Go modules by build-buildkit.sh), so the images come from the
# same bake file, Dockerfile frontend and BuildKit as on a developer's Docker, not from buildah.
#
#   1. buildkitd starts (OCI worker, root, state kept under the cache so its build cache and the
#      uv cache mount outlive the run) on a unix socket of its own; buildx reaches it with its
#      `remote` driver, its config in a folder of its own (~/.docker is not touched).
#   2. The FROM images: a mirror's (PYTHON_IMAGE / UV_IMAGE) are pulled by BuildKit itself; else
#      the local ones (local-bases.sh) are pushed to a registry on loopback for it to pull.
#   3. The Dockerfiles name no `# syntax=` image: BuildKit's own Dockerfile frontend builds them
#      (nothing is pulled from Docker Hub).
#   4. Each image is written as an OCI archive $OUT/<component>.tar, tagged as docker-bake.hcl
#      tags it; `PUSH=1` pushes them to $REGISTRY instead (type=registry).
#
# Environment (the Makefile sets them): REGISTRY, <COMPONENT>_VERSION (docker-bake.hcl's
# variables), COMPONENTS, PYTHON_IMAGE, UV_IMAGE, UV, OUT (default build/docker), PUSH,
# SSL_CERT_FILE (the CA bundle the build reaches PyPI with).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"

read -r -a components <<< "${COMPONENTS:-device-plugin scheduler exporter controller job-agent operator}"
out=${OUT:-build/docker}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cache=${LJ_RUNTIMEKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lj-runtimekit}
state=$cache/buildkit/state
mkdir -p "$state"
# One daemon on this state at a time: a second `make docker` waits for the first.
exec 8>"$state/.lock"
flock 8

bins=$("$here/build-buildkit.sh" | tail -n1)
# BuildKit's OCI worker runs its steps with runc (crun lacks the `run --keep` it uses).
"$here/install-tools.sh" runc
runtime=$(command -v runc)

run=$(mktemp -d "${TMPDIR:-/tmp}/lj-buildkit.XXXXXX")
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$run"
}
trap cleanup EXIT
wait_for() { # what-for seconds command...
  local what=$1 seconds=$2 t=$SECONDS
  shift 2
  until "$@" >/dev/null 2>&1; do
    if (( SECONDS - t >= seconds )); then
      echo "$what: not within $seconds s" >&2
      return 1
    fi
    sleep 0.2
  done
}

# The FROM images, and the registry BuildKit pulls the local ones from.
registry_host=""
if [[ -n ${PYTHON_IMAGE:-} && -n ${UV_IMAGE:-} ]]; then
  python_image=$PYTHON_IMAGE uv_image=$UV_IMAGE
else
  bases_line=$("$here/local-bases.sh" | tail -n1)
  read -r local_python local_uv <<< "$bases_line"
  reg_bins=$("$repo/tests/cluster/build-registry.sh" | tail -n1)
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  registry_host=127.0.0.1:$port
  mkdir -p "$run/registry"
  cat > "$run/registry.yml" <<EOF
version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: $run/registry}}
http: {addr: "$registry_host", secret: lj-runtimekit-bake}
EOF
  "$reg_bins/registry" serve "$run/registry.yml" > "$run/registry.log" 2>&1 &
  pids+=($!)
  wait_for "the loopback registry at $registry_host" 30 curl -fsS "http://$registry_host/v2/"
  push_base() { # local-ref → prints the ref BuildKit pulls
    local ref=$registry_host/lj-runtimekit/${1##*/}
    "$here/buildah.sh" push --quiet --tls-verify=false "$1" "docker://$ref" >/dev/null
    echo "$ref"
  }
  python_image=${PYTHON_IMAGE:-$(push_base "$local_python")}
  uv_image=${UV_IMAGE:-$(push_base "$local_uv")}
fi

# The daemon: plain HTTP to the loopback registry only.
{
  echo 'debug = false'
  echo '[worker.oci]'
  echo '  enabled = true'
  echo "  binary = \"$runtime\""
  echo '  gc = true'
  echo '  gckeepstorage = "10GB"'
  echo '[worker.containerd]'
  echo '  enabled = false'
  if [[ -n $registry_host ]]; then
    echo "[registry.\"$registry_host\"]"
    echo '  http = true'
    echo '  insecure = true'
  fi
} > "$run/buildkitd.toml"
socket=$run/buildkitd.sock
"$bins/buildkitd" --config "$run/buildkitd.toml" --root "$state/root" \
  --addr "unix://$socket" > "$run/buildkitd.log" 2>&1 &
pids+=($!)
if ! wait_for "buildkitd on $socket" 60 "$bins/buildctl" --addr "unix://$socket" debug workers; then
  tail -n 30 "$run/buildkitd.log" >&2
  exit 1
fi

export BUILDX_CONFIG=$run/buildx
builder=lj-runtimekit-bake
"$bins/buildx" create --name "$builder" --driver remote "unix://$socket" >/dev/null

ca_bundle=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
sets=(--set "*.args.PYTHON_IMAGE=$python_image" --set "*.args.UV_IMAGE=$uv_image")
if [[ -f $ca_bundle ]]; then
  sets+=(--set "*.secrets=id=ca-certificates,src=$(readlink -f "$ca_bundle")"
    --set "*.args.SSL_CERT_FILE=/run/lj-runtimekit/ca-certificates.crt")
fi
for c in "${components[@]}"; do
  if [[ -n ${PUSH:-} ]]; then
    sets+=(--set "$c.output=type=registry")
  else
    sets+=(--set "$c.output=type=oci,dest=$out/$c.tar")
  fi
done
start=$SECONDS
if ! "$bins/buildx" bake --builder "$builder" --file docker-bake.hcl --progress plain \
    "${sets[@]}" "${components[@]}" > "$out/bake.log" 2>&1; then
  tail -n 40 "$out/bake.log" >&2
  echo "== make docker: buildx bake failed (whole log: $out/bake.log; buildkitd's: kept below)" >&2
  tail -n 20 "$run/buildkitd.log" >&2
  exit 1
fi
where=$out
[[ -n ${PUSH:-} ]] && where=${REGISTRY:-docker-bake.hcl\'s REGISTRY}
echo "== make docker: ${#components[@]} images by buildx $("$bins/buildx" version | awk '{print $2}') on BuildKit $("$bins/buildkitd" --version | awk '{print $3}') in $((SECONDS - start)) s → $where" >&2
