#!/usr/bin/env bash
# Builds the harness' OCI registry and one push tool from Go modules, pinned, into the binary cache:
#   registry  the CNCF distribution registry (github.com/distribution/distribution/v3/cmd/registry)
#   crane     go-containerregistry's registry client (github.com/google/go-containerregistry/cmd/crane)
# The offline-bundle tests run the registry on loopback and push the bundle's images with crane
# and its charts with helm. Only what is missing is built; each binary lands whole or not at all.
# Progress goes to stderr; the last line of stdout is the directory holding both binaries.
#
# Override the pins with REGISTRY_MODULE_VERSION / CRANE_MODULE_VERSION.
set -euo pipefail
registry_version=${REGISTRY_MODULE_VERSION:-v3.1.2}
crane_version=${CRANE_MODULE_VERSION:-v0.22.1}

cache=${LJ_RUNTIMEKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lj-runtimekit}
out="$cache/registry/distribution-${registry_version}_crane-${crane_version}"
if [[ -x "$out/registry" && -x "$out/crane" ]]; then
  echo "$out"
  exit 0
fi

# One build of this entry at a time (make test's phases, a demo or a second clone beside it): the
# second waits for the first, then finds the result.
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
if [[ -x "$out/registry" && -x "$out/crane" ]]; then echo "$out"; exit 0; fi

command -v go >/dev/null || { echo "go not found: the registry and crane are built with the Go toolchain" >&2; exit 1; }
step_label=registry-binaries
# shellcheck source=go-commands.sh
source "$(dirname "$0")/go-commands.sh"

work="$cache/registry/src"
partial="$out.partial"
rm -rf "$partial"
mkdir -p "$work" "$partial"
export GOFLAGS=-buildvcs=false CGO_ENABLED=0

step "building the missing registry binaries into $out (first time only)"
build registry github.com/distribution/distribution/v3/cmd/registry "$registry_version" \
  "-X github.com/distribution/distribution/v3/version.version=$registry_version"
build crane github.com/google/go-containerregistry/cmd/crane "$crane_version" \
  "-X github.com/google/go-containerregistry/cmd/crane/cmd.Version=$crane_version"
rm -rf "$partial"
echo "$out"
