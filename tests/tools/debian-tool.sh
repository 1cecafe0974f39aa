#!/usr/bin/env bash
# Fetches a Debian package's files into a cache outside the repository (no install, no service
# started) and prints the path of the binary asked for, e.g.
#   tests/tools/debian-tool.sh prometheus usr/bin/prometheus
#   tests/tools/debian-tool.sh containerd usr/bin/containerd
# Tests start these binaries themselves on loopback with their own config.
set -euo pipefail
package=$1 binary=$2
cache=${LJ_RUNTIMEKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lj-runtimekit}/debian
root="$cache/$package/root"
if [[ -x "$root/$binary" ]]; then echo "$root/$binary"; exit 0; fi
if [[ -x "/$binary" ]]; then echo "/$binary"; exit 0; fi

# One build of this entry at a time (make test's phases, a demo or a second clone beside it): the
# second waits for the first, then finds the result.
mkdir -p "$(dirname "$cache/$package")"
exec 9>"$cache/$package.lock"
flock 9
if [[ -x "$root/$binary" ]]; then echo "$root/$binary"; exit 0; fi
mkdir -p "$cache/$package"
cd "$cache/$package"
if ! apt-get download "$package" >/dev/null 2>&1; then
  # the package lists may be missing on a fresh machine
  apt-get update -qq >/dev/null 2>&1 || { echo "apt-get update failed: cannot fetch $package" >&2; exit 1; }
  apt-get download "$package" >/dev/null || { echo "apt-get download $package failed" >&2; exit 1; }
fi
rm -rf root.partial && mkdir root.partial
dpkg -x "$(ls -t ./"${package}"_*.deb | head -1)" root.partial
rm -rf root && mv root.partial root
[[ -x "$root/$binary" ]] || { echo "$package has no $binary" >&2; exit 1; }
echo "$root/$binary"
