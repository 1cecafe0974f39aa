#!/usr/bin/env bash
# Builds BuildKit and buildx from Go modules, pinned, into the binary cache, for `make docker` on a
# machine with no Docker engine (tests/images/docker-bake.sh):
#   buildkitd  BuildKit's daemon (github.com/moby/buildkit/cmd/buildkitd), OCI worker
#   buildctl   its client, for `buildctl debug workers` when the daemon is checked
#   buildx     docker/buildx as a standalone binary (`buildx bake`), driven against buildkitd
#              with its `remote` driver
# Only what is missing is built; each binary lands whole or not at all. Progress goes to stderr;
# the last line of stdout is the directory holding the three binaries.
#
# Override the pins with BUILDKIT_MODULE_VERSION / BUILDX_MODULE_VERSION.
set -euo pipefail
buildkit_version=${BUILDKIT_MODULE_VERSION:-v0.35.1}
buildx_version=${BUILDX_MODULE_VERSION:-v0.39.1}

cache=${LJ_RUNTIMEKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lj-runtimekit}
out="$cache/buildkit/buildkit-${buildkit_version}_buildx-${buildx_version}"
complete() { [[ -x "$out/buildkitd" && -x "$out/buildctl" && -x "$out/buildx" ]]; }
if complete; then
  echo "$out"
  exit 0
fi

# One build of this entry at a time (a second clone or target beside this one waits, then finds it).
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
if complete; then echo "$out"; exit 0; fi

command -v go >/dev/null || { echo "go not found: BuildKit and buildx are built with the Go toolchain" >&2; exit 1; }
step_label=buildkit-binaries
# shellcheck source=../cluster/go-commands.sh
source "$(dirname "$0")/../cluster/go-commands.sh"

work="$cache/buildkit/src"
partial="$out.partial"
rm -rf "$partial"
mkdir -p "$work" "$partial"
export GOFLAGS=-buildvcs=false CGO_ENABLED=0

step "building BuildKit and buildx into $out (first time only, a few minutes)"
build buildkitd github.com/moby/buildkit/cmd/buildkitd "$buildkit_version" \
  "-X github.com/moby/buildkit/version.Version=$buildkit_version"
build buildctl github.com/moby/buildkit/cmd/buildctl "$buildkit_version" \
  "-X github.com/moby/buildkit/version.Version=$buildkit_version"
build buildx github.com/docker/buildx/cmd/buildx "$buildx_version" \
  "-X github.com/docker/buildx/version.Version=$buildx_version"
rm -rf "$partial"
echo "$out"
