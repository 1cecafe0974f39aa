#!/usr/bin/env bash
# Deploys or removes LJ RuntimeKit on the cluster kubectl points at (guide §3.3).
#
#   deploy/deploy-all.sh deploy   [--components=device-plugin,scheduler,exporter,controller] [--dry-run]
#   deploy/deploy-all.sh undeploy [--components=...] [--dry-run]
#   deploy/deploy-all.sh verify   [--components=...]
#
# Environment:
#   lj_runtimekit_version   image tag for every component (e.g. v1.13.0); unset: the tags written
#                           in the manifests (edit them there to upgrade one component, §7.3)
#   LJ_RUNTIMEKIT_REGISTRY  image registry; unset: the registry written in the manifests
#   KUBECTL                 the kubectl to use (default: kubectl on PATH); KUBECONFIG as usual
#   LJ_RUNTIMEKIT_LOG_DIR   where the log of this run goes (default: ./lj-runtimekit-deploy-logs)
#   ROLLOUT_TIMEOUT         how long to wait for each rollout (default 300s)
#   NODE_LABEL              the feature label of the nodes to run on (default lj_runtimekit_enable=true)
#
# It can be run again at any time: objects are applied, so a second run changes nothing.
# Objects shared by all components (the CRDs and the lj-runtime RuntimeClass) are applied on every
# deploy and removed only by an undeploy of all components.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
KUBECTL=${KUBECTL:-kubectl}
NS=kube-system
NODE_LABEL=${NODE_LABEL:-lj_runtimekit_enable=true}
ROLLOUT_TIMEOUT=${ROLLOUT_TIMEOUT:-300s}
ALL_COMPONENTS=(device-plugin exporter scheduler controller)
MIN_SERVER_MINOR=30 # ValidatingAdmissionPolicy v1 (admissionregistration.k8s.io/v1)

usage() {
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

ts() { date -u +%Y-%m-%dT%H:%M:%SZ; }
log() { echo "$(ts) [$1] ${*:2}"; }
info() { log INFO "$@"; }
warn() { log WARN "$@"; }
die() {
  log ERROR "$1"
  [[ -n ${2:-} ]] && log HINT "$2"
  exit 1
}

folder_of() { # component → manifest folder (the guide's names)
  case $1 in
    device-plugin) echo deviceplugin ;;
    scheduler | exporter | controller) echo "$1" ;;
    *) die "unknown component '$1'" "known components: ${ALL_COMPONENTS[*]}" ;;
  esac
}

workload_of() { # component → kind/name of what rolls out
  case $1 in
    device-plugin | exporter) echo "daemonset/lj-runtimekit-$1" ;;
    scheduler | controller) echo "deployment/lj-runtimekit-$1" ;;
  esac
}

# The manifests of a folder with the image registry and tag of this run, if given.
render() {
  local f
  for f in "$here/$1"/[0-9]*.yaml; do
    echo "---"
    sed -E -e "" \
      ${LJ_RUNTIMEKIT_REGISTRY:+-e "s#([\"= ])[^\"= ]+/(lj-runtimekit-[a-z-]+):#\\1${LJ_RUNTIMEKIT_REGISTRY}/\\2:#"} \
      ${lj_runtimekit_version:+-e "s#(/lj-runtimekit-[a-z-]+):[A-Za-z0-9._-]+#\\1:${lj_runtimekit_version}#"} \
      "$f"
  done
}

k() { "$KUBECTL" "$@"; }

preflight() {
  info "preflight: kubectl and the cluster"
  command -v "$KUBECTL" >/dev/null || die "kubectl not found ($KUBECTL)" \
    "install kubectl or point KUBECTL at it"
  local version
  version=$(k version -o json 2>&1) || die "the cluster is not reachable: $(tail -n1 <<<"$version")" \
    "check KUBECONFIG and run: $KUBECTL cluster-info"
  local minor
  minor=$(sed -nE '/"serverVersion"/,/}/ s/.*"minor": *"([0-9]+).*/\1/p' <<<"$version" | head -n1)
  [[ -n $minor ]] || die "cannot read the server version" "run: $KUBECTL version"
  ((minor >= MIN_SERVER_MINOR)) || die "Kubernetes 1.$minor is too old" \
    "LJ RuntimeKit needs Kubernetes 1.$MIN_SERVER_MINOR or newer (ValidatingAdmissionPolicy v1)"
  info "server is Kubernetes 1.$minor"
  k get namespace "$NS" >/dev/null || die "namespace $NS not found" "run: $KUBECTL get ns"

  if wants device-plugin || wants exporter; then
    local labelled
    labelled=$(k get nodes -l "$NODE_LABEL" -o name | wc -l)
    if ((labelled == 0)); then
      die "no node carries the label $NODE_LABEL: the device plugin and exporter would run nowhere" \
        "label the accelerator nodes: $KUBECTL label node <node-name> $NODE_LABEL"
    fi
    info "$labelled node(s) labelled $NODE_LABEL"
  fi

  local handler
  handler=$(k get runtimeclass lj-runtime -o jsonpath='{.handler}' 2>/dev/null || true)
  if [[ -n $handler && $handler != lj-runtime ]]; then
    die "RuntimeClass lj-runtime exists with handler '$handler', expected 'lj-runtime'" \
      "delete it (kubectl delete runtimeclass lj-runtime) and deploy again"
  fi

  if wants scheduler && grep -qiE '^\s*gang' "$here/scheduler/01-configmap.yaml"; then
    if k get crd jobsets.jobset.x-k8s.io >/dev/null 2>&1; then
      info "JobSet is installed (gang scheduling of JobSets)"
    else
      warn "JobSet is not installed: JobSet gangs cannot be used; pods with the pod-group" \
        "annotation still can. To install: https://jobset.sigs.k8s.io (v0.8.0 or later)"
    fi
  fi
}

selected=()
wants() {
  local c
  for c in "${selected[@]}"; do [[ $c == "$1" ]] && return 0; done
  return 1
}

apply_folder() {
  info "apply deploy/$1"
  render "$1" | k apply ${dry_run:+--dry-run=server} -f - | sed "s/^/$(ts) [INFO]   /"
}

delete_folder() {
  info "delete deploy/$1"
  render "$1" | k delete ${dry_run:+--dry-run=server} --ignore-not-found --wait=true -f - |
    sed "s/^/$(ts) [INFO]   /"
}

deploy() {
  preflight
  info "apply the shared objects (CRDs, RuntimeClass)"
  k apply ${dry_run:+--dry-run=server} -f "$here/crds/" | sed "s/^/$(ts) [INFO]   /"
  [[ -n $dry_run ]] || k wait --for=condition=Established --timeout=60s -f "$here/crds/" >/dev/null
  apply_folder common
  local c
  for c in "${selected[@]}"; do apply_folder "$(folder_of "$c")"; done
  [[ -n $dry_run ]] && { info "dry run: nothing was changed"; return; }
  for c in "${selected[@]}"; do
    info "wait for $(workload_of "$c") to roll out (timeout $ROLLOUT_TIMEOUT)"
    k -n "$NS" rollout status "$(workload_of "$c")" --timeout="$ROLLOUT_TIMEOUT" ||
      die "$(workload_of "$c") did not become ready" \
        "kubectl -n $NS describe $(workload_of "$c"); kubectl -n $NS logs -l app=lj-runtimekit-$c"
  done
  verify
}

undeploy() {
  local i c
  for ((i = ${#selected[@]} - 1; i >= 0; i--)); do delete_folder "$(folder_of "${selected[i]}")"; done
  if ((${#selected[@]} == ${#ALL_COMPONENTS[@]})); then
    delete_folder common
    info "delete the shared objects (CRDs, RuntimeClass)"
    k delete ${dry_run:+--dry-run=server} --ignore-not-found --wait=true -f "$here/crds/" |
      sed "s/^/$(ts) [INFO]   /"
  else
    info "kept the shared objects (CRDs, RuntimeClass): other components may use them"
  fi
  [[ -n $dry_run ]] && info "dry run: nothing was changed"
  info "undeploy done"
}

# The checks of guide §3.4, printed as a summary.
verify() {
  info "verification (guide §3.4)"
  local c failed=0
  for c in "${selected[@]}"; do
    local w ready want
    w=$(workload_of "$c")
    if [[ $w == daemonset/* ]]; then
      want=$(k -n "$NS" get "$w" -o jsonpath='{.status.desiredNumberScheduled}' 2>/dev/null || echo "?")
      ready=$(k -n "$NS" get "$w" -o jsonpath='{.status.numberReady}' 2>/dev/null || echo "?")
    else
      want=$(k -n "$NS" get "$w" -o jsonpath='{.spec.replicas}' 2>/dev/null || echo "?")
      ready=$(k -n "$NS" get "$w" -o jsonpath='{.status.readyReplicas}' 2>/dev/null || echo "?")
    fi
    ready=${ready:-0}
    if [[ $want != "?" && $ready == "$want" ]]; then
      printf '%s [INFO]   %-32s ready %s/%s\n' "$(ts)" "$w" "$ready" "$want"
    else
      printf '%s [WARN]   %-32s ready %s/%s\n' "$(ts)" "$w" "$ready" "$want"
      failed=1
    fi
  done
  info "pods:"
  k -n "$NS" get pods -o wide -l 'app in (lj-runtimekit-device-plugin,lj-runtimekit-scheduler,lj-runtimekit-exporter,lj-runtimekit-controller)' |
    sed "s/^/$(ts) [INFO]   /"
  if wants device-plugin; then
    info "extended resources of the labelled nodes (capacity):"
    k get nodes -l "$NODE_LABEL" -o \
      'custom-columns=NODE:.metadata.name,GPU:.status.capacity.aliyun\.com/gpu,GPU-CORE:.status.capacity.aliyun\.com/gpu-core,GPU-MEMORY:.status.capacity.aliyun\.com/gpu-memory,PPU:.status.capacity.alibabacloud\.com/ppu' |
      sed "s/^/$(ts) [INFO]   /"
  fi
  if wants exporter; then
    info "exporter metrics: on a labelled node run: curl -s localhost:9501/metrics | head -20"
  fi
  info "runtime class: $(k get runtimeclass lj-runtime -o jsonpath='{.metadata.name} (handler {.handler})' 2>/dev/null || echo missing)"
  ((failed == 0)) || die "some workloads are not ready" \
    "kubectl -n $NS describe pod -l app=lj-runtimekit-<component>; kubectl -n $NS logs <pod>"
  info "all selected components are ready"
}

main() {
  [[ $# -ge 1 ]] || usage 2
  local action=$1 arg
  shift
  dry_run=""
  local components=""
  for arg in "$@"; do
    case $arg in
      --components=*) components=${arg#--components=} ;;
      --dry-run) dry_run=1 ;;
      -h | --help) usage 0 ;;
      *) echo "unknown argument: $arg" >&2; usage 2 ;;
    esac
  done
  case $action in
    deploy | undeploy | verify) ;;
    -h | --help | help) usage 0 ;;
    *) echo "unknown action: $action" >&2; usage 2 ;;
  esac
  if [[ -n $components ]]; then
    IFS=, read -r -a selected <<<"$components"
    local c
    for c in "${selected[@]}"; do folder_of "$c" >/dev/null; done
  else
    selected=("${ALL_COMPONENTS[@]}")
  fi

  local log_dir=${LJ_RUNTIMEKIT_LOG_DIR:-./lj-runtimekit-deploy-logs}
  mkdir -p "$log_dir"
  local logfile
  logfile="$log_dir/$action-$(date -u +%Y%m%dT%H%M%SZ)-$$.log"
  exec > >(tee -a "$logfile") 2>&1
  info "deploy-all.sh $action components=${selected[*]}${dry_run:+ (dry run)} log=$logfile"
  info "images: registry=${LJ_RUNTIMEKIT_REGISTRY:-<as in the manifests>} version=${lj_runtimekit_version:-<as in the manifests>}"
  "$action"
}

main "$@"
