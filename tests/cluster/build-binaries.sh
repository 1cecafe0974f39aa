#!/usr/bin/env bash
# Builds the test control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kwok) and the operator's tools the deploy tests drive (kubectl, helm) from Go modules with this
# machine's Go toolchain, into a cache keyed by version. Only missing binaries are built.
# Prints the directory holding the binaries on its last line.
#
# Honours KUBEBUILDER_ASSETS (the envtest convention) when it already holds every binary.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"

binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kubectl helm)
kube_binaries=(kube-apiserver kube-controller-manager kube-scheduler kubectl)

have_all() {
  local dir=$1 b
  for b in "${binaries[@]}"; do [[ -x "$dir/$b" ]] || return 1; done
}

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]] && have_all "$KUBEBUILDER_ASSETS"; then
  echo "using binaries from KUBEBUILDER_ASSETS" >&2
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

cache=${LJ_RUNTIMEKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lj-runtimekit}
key="k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}"
out="$cache/k8s/$key"
if have_all "$out"; then
  echo "$out"
  exit 0
fi

# One build of this entry at a time (make test's phases, a demo or a second clone beside it): the
# second waits for the first, then finds the result.
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
if have_all "$out"; then echo "$out"; exit 0; fi

command -v go >/dev/null || { echo "go not found: the test control plane is built with the Go toolchain" >&2; exit 1; }
proxy=${GOPROXY:-$(go env GOPROXY)}
proxy=${proxy%%,*}
work="$cache/k8s/src-$key"
mkdir -p "$work"
export GOFLAGS=-buildvcs=false CGO_ENABLED=0

k8s_minor=${KUBERNETES_VERSION#v1.}; k8s_minor=${k8s_minor%%.*}
staging="v0.${KUBERNETES_VERSION#v1.}"

build_kubernetes() {
  local dir="$work/kubernetes"
  mkdir -p "$dir"
  cd "$dir"
  # k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with local paths,
  # which a dependent module cannot see: pin each to its published tag instead.
  curl -fsSL "$proxy/k8s.io/kubernetes/@v/$KUBERNETES_VERSION.mod" -o upstream.mod
  {
    echo "module ljrk.invalid/k8sbin"
    echo
    echo "go $(awk '$1=="go"{print $2; exit}' upstream.mod)"
    echo
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    echo
    awk '$2=="v0.0.0" && $1 ~ /^k8s\.io\// {print "replace " $1 " => " $1 " '"$staging"'"}' upstream.mod | sort -u
  } > go.mod
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
  go mod tidy -e >/dev/null 2>&1 || true
  local pkg=k8s.io/component-base/version
  local ld="-s -w -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  ld="$ld -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$k8s_minor"
  local pkgs=() b
  for b in "${kube_binaries[@]}"; do missing "$b" && pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  go get "${pkgs[@]/%/@$KUBERNETES_VERSION}" >/dev/null
  go build -tags tools -trimpath -ldflags "$ld" -o "$out.partial/" "${pkgs[@]}"
}

build_module_main() { # name module package version ldflags
  local name=$1 module=$2 pkg=$3 version=$4 ld=$5 dir="$work/$1"
  mkdir -p "$dir"
  cd "$dir"
  printf 'module ljrk.invalid/%s\n\ngo 1.24\n' "$name" > go.mod
  go get "$pkg@$version" >/dev/null
  go build -trimpath -ldflags "-s -w $ld" -o "$out.partial/$name" "$pkg"
}

missing() { [[ ! -x "$out/$1" ]]; }

start=$(date +%s)
echo "building the missing test binaries into $out (first time only)" >&2
rm -rf "$out.partial"
mkdir -p "$out.partial"
need_kube=false
for b in "${kube_binaries[@]}"; do missing "$b" && need_kube=true; done
$need_kube && build_kubernetes
missing etcd && build_module_main etcd go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3 "$ETCD_VERSION" ""
missing kwok && build_module_main kwok sigs.k8s.io/kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION" \
  "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=$KUBERNETES_VERSION"
missing helm && build_module_main helm helm.sh/helm/v4 helm.sh/helm/v4/cmd/helm "$HELM_VERSION" \
  "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
# Each binary lands whole or not at all: a build cut off halfway leaves only the .partial dir.
mkdir -p "$out"
for b in "$out.partial"/*; do mv -f "$b" "$out/"; done
rm -rf "$out.partial"
echo "built in $(( $(date +%s) - start )) s" >&2
echo "$out"
