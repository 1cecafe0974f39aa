#!/usr/bin/env bash
# Builds upstream Prometheus with Kubernetes service discovery, pinned, from Go modules, into a
# cache outside the repository, and prints the binary's path. Debian's prometheus package is
# built without Kubernetes discovery ("Kubernetes support has been completely removed", its
# NEWS.Debian), so it cannot run the kit's scrape config; the upstream build tags keep only the
# discovery we need, which keeps the build short (remove_all_sd + enable_kubernetes_sd).
set -euo pipefail
version=${PROMETHEUS_MODULE_VERSION:-v0.316.0}
cache=${LJ_RUNTIMEKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lj-runtimekit}/prometheus-k8s/$version
if [[ -x "$cache/prometheus" ]]; then echo "$cache/prometheus"; exit 0; fi

# One build of this entry at a time (make test's phases, a demo or a second clone beside it): the
# second waits for the first, then finds the result.
mkdir -p "$(dirname "$cache")"
exec 9>"$cache.lock"
flock 9
if [[ -x "$cache/prometheus" ]]; then echo "$cache/prometheus"; exit 0; fi
command -v go >/dev/null || { echo "need the Go toolchain to build Prometheus" >&2; exit 1; }
mkdir -p "$cache"
echo "== building Prometheus $version with Kubernetes discovery (once, into $cache)" >&2
GOBIN="$cache.partial" GOFLAGS=-mod=mod CGO_ENABLED=0 \
  go install -trimpath -tags remove_all_sd,enable_kubernetes_sd \
  "github.com/prometheus/prometheus/cmd/prometheus@$version" >&2
mv "$cache.partial/prometheus" "$cache/prometheus"
rmdir "$cache.partial"
echo "$cache/prometheus"
