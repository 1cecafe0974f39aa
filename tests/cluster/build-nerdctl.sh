#!/usr/bin/env bash
# Builds nerdctl (github.com/containerd/nerdctl/v2/cmd/nerdctl), pinned, from Go modules into the
# binary cache, statically (CGO_ENABLED=0), so the offline-bundle tests can put it on a real
# node's PATH and run the installer's `load --tool=nerdctl` against the node's containerd. Its
# containerd client speaks the same v2 API as the nodes' containerd (v2.4.2); `load` needs no
# buildkit. Only a missing binary is built, and it lands whole or not at all.
# Progress goes to stderr; the last line of stdout is the directory holding the binary.
#
# Override the pin with NERDCTL_MODULE_VERSION.
set -euo pipefail
version=${NERDCTL_MODULE_VERSION:-v2.2.2}
pkg=github.com/containerd/nerdctl/v2/cmd/nerdctl

cache=${LJ_RUNTIMEKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lj-runtimekit}
out="$cache/nerdctl/nerdctl-${version}"
if [[ -x "$out/nerdctl" ]]; then
  echo "$out"
  exit 0
fi

# One build of this entry at a time (make test's phases, a demo or a second clone beside it): the
# second waits for the first, then finds the result.
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
if [[ -x "$out/nerdctl" ]]; then echo "$out"; exit 0; fi

command -v go >/dev/null || { echo "go not found: nerdctl is built with the Go toolchain" >&2; exit 1; }
step() { echo "[nerdctl] $*" >&2; }

work="$cache/nerdctl/src/nerdctl-$version"
partial="$out.partial"
rm -rf "$partial" "$work"
mkdir -p "$(dirname "$work")" "$partial"
export GOFLAGS=-buildvcs=false CGO_ENABLED=0
t=$SECONDS
step "building nerdctl $version from $pkg into $out (first time only)"
# Built inside nerdctl's own module, so its go.mod and go.sum pin every dependency (a throwaway
# module's `go get` cannot: nerdctl replaces its test-only module mod/tigron with ./mod/tigron,
# a nested module its zip leaves out and the proxy does not serve). Only nerdctl's test helpers
# import tigron: an empty module stands in for it, and cmd/nerdctl/helpers/testing_linux.go, the
# one non-_test file that links them in (helpers only its integration tests call), is left out.
cd "$(dirname "$work")"
src=$(go mod download -json "github.com/containerd/nerdctl/v2@$version" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -n "$src" && -f "$src/go.mod" ]] || { step "go mod download gave no source for nerdctl $version"; exit 1; }
cp -r "$src" "$work"
chmod -R u+w "$work"
mkdir -p "$work/mod/tigron"
printf 'module github.com/containerd/nerdctl/mod/tigron\n\ngo 1.24\n' > "$work/mod/tigron/go.mod"
rm "$work/cmd/nerdctl/helpers/testing_linux.go"
cd "$work"
go build -trimpath \
  -ldflags "-s -w -X github.com/containerd/nerdctl/v2/pkg/version.Version=$version" \
  -o "$partial/nerdctl" ./cmd/nerdctl
mkdir -p "$out"
mv -f "$partial/nerdctl" "$out/nerdctl"
rm -rf "$partial" "$work"
rmdir "$(dirname "$work")" 2>/dev/null || true
step "nerdctl built in $(( SECONDS - t )) s"
echo "$out"
