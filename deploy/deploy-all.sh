#!/usr/bin/env bash
# Deploys or removes LJ RuntimeKit on the cluster kubectl points at (guide §3.3).
#
#   deploy/deploy-all.sh deploy   [--components=device-plugin,scheduler,exporter,controller] [--dry-run]
#   deploy/deploy-all.sh undeploy [--components=...] [--dry-run] [--force]
#   deploy/deploy-all.sh verify   [--components=...]
#
# Every action first says which cluster it acts on (kubectl's current context and server).
# An undeploy of all components first switches the feature off on every node (guide §3.5): it
# removes the node label, waits until the controller's disable Jobs have taken the lj-runtime
# handler out of each node's containerd (DISABLE_TIMEOUT), and only then deletes the controller;
# at the end no node keeps a label or annotation of the suite. --force goes on after a timeout.
#
# Environment:
#   lj_runtimekit_version   image tag for every component (e.g. v1.13.0); unset: the tags written
#                           in the manifests (edit them there to upgrade one component, §7.3)
#   LJ_RUNTIMEKIT_REGISTRY  image registry; unset: the registry written in the manifests
#   KUBECTL                 the kubectl to use (default: kubectl on PATH); KUBECONFIG as usual
#   LJ_RUNTIMEKIT_LOG_DIR   where the log of this run goes (default: ./lj-runtimekit-deploy-logs)
#   ROLLOUT_TIMEOUT         how long to wait for each rollout (default 300s)
#   NODE_LABEL              the feature label of the nodes to run on (default lj_runtimekit_enable=true)
#   DISABLE_TIMEOUT         seconds an undeploy waits for the nodes to be disabled (default 600)
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
DISABLE_TIMEOUT=${DISABLE_TIMEOUT:-600}
ALL_COMPONENTS=(device-plugin exporter scheduler controller)
STATUS_ANNOTATION=lj-runtimekit-controller/last-action-status
AGENT_JOBS=app.kubernetes.io/managed-by=lj-runtimekit-controller
# What the suite writes on nodes: the device plugin's labels, the components' annotations.
OUR_LABEL_PREFIX=lj-runtimekit.aliyun.com/
OUR_ANNOTATION_PREFIXES=(lj-runtimekit-controller/ lj-runtimekit-device-plugin/ lj-runtimekit-scheduler/ lj-runtimekit-exporter/)
MIN_SERVER_MINOR=30 # ValidatingAdmissionPolicy v1 (admissionregistration.k8s.io/v1)

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
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

# Which cluster this run acts on, said before anything is changed.
cluster() {
  command -v "$KUBECTL" >/dev/null || die "kubectl not found ($KUBECTL)" \
    "install kubectl or point KUBECTL at it"
  local context server
  context=$(k config current-context 2>/dev/null) || context="<none: in-cluster or KUBECONFIG without current-context>"
  server=$(k config view --minify -o jsonpath='{.clusters[0].cluster.server}' 2>/dev/null) || server=""
  info "cluster: context '$context', server ${server:-<unknown>}"
}

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

# Every node's name, then per line "node<TAB>label|annotation<TAB>key<TAB>value" for its labels
# and annotations (the value only for the controller's status, the one read here).
node_meta() {
  k get nodes -o go-template='{{range .items}}{{$n := .metadata.name}}{{range $k, $v := .metadata.labels}}{{$n}}{{"\t"}}label{{"\t"}}{{$k}}{{"\t"}}{{"\n"}}{{end}}{{range $k, $v := .metadata.annotations}}{{$n}}{{"\t"}}annotation{{"\t"}}{{$k}}{{"\t"}}{{if eq $k "'"$STATUS_ANNOTATION"'"}}{{$v}}{{end}}{{"\n"}}{{end}}{{end}}'
}

# Nodes not yet disabled, one "node<TAB>why" per line: a status other than a succeeded disable,
# or an agent Job still running.
not_disabled() {
  local meta jobs
  meta=$(node_meta) || return 1
  jobs=$(k -n "$NS" get jobs -l "$AGENT_JOBS" \
    -o go-template='{{range .items}}{{if .status.active}}{{index .metadata.annotations "lj-runtimekit-controller/node"}}{{"\t"}}Job {{.metadata.name}} running{{"\n"}}{{end}}{{end}}') || return 1
  awk -F'\t' -v key="$STATUS_ANNOTATION" '
    $2 == "annotation" && $3 == key {
      if (!($4 ~ /"action": *"disable"/ && $4 ~ /"result": *"succeeded"/)) {
        why = act = res = ""
        if ($4 ~ /"message": *"/) { why = $4; sub(/.*"message": *"/, "", why); sub(/".*/, "", why) }
        if ($4 ~ /"action": *"/) { act = $4; sub(/.*"action": *"/, "", act); sub(/".*/, "", act) }
        if ($4 ~ /"result": *"/) { res = $4; sub(/.*"result": *"/, "", res); sub(/".*/, "", res) }
        print $1 "\tlast action " act " " res (why != "" ? ": " why : "")
      }
    }' <<<"$meta"
  if [[ -n $jobs ]]; then printf '%s\n' "$jobs"; fi
}

controller_ready() {
  local ready
  ready=$(k -n "$NS" get deployment lj-runtimekit-controller -o jsonpath='{.status.readyReplicas}' 2>/dev/null || true)
  [[ ${ready:-0} -ge 1 ]]
}

# Guide §3.5: without the label the controller runs the disable Job on each node; the suite is
# removed only once no node's containerd keeps the lj-runtime handler.
disable_nodes() {
  local key=${NODE_LABEL%%=*} labelled pending deadline next_report=0
  labelled=$(k get nodes -l "$key" -o name) || die "cannot list the nodes" "run: $KUBECTL get nodes"
  pending=$(not_disabled) || die "cannot read the nodes' status" "run: $KUBECTL get nodes"
  if [[ -z $labelled && -z $pending ]]; then
    info "no node is labelled $key or enabled: nothing to disable"
    return
  fi
  if [[ -n $dry_run ]]; then
    info "dry run: would remove the label $key from: $(tr '\n' ' ' <<<"$labelled")"
    info "dry run: would wait for the controller to disable: $(cut -f1 <<<"$pending" | sort -u | tr '\n' ' ')"
    return
  fi
  # Only nodes with a status (or a running Job) need the controller; labelled nodes it never
  # enabled just lose the label.
  if [[ -n $pending ]] && ! controller_ready; then
    local msg="the controller is not running: nobody can switch the feature off on the nodes (their containerd keeps the lj-runtime handler)"
    [[ -n $force ]] || die "$msg" \
      "deploy it first (deploy-all.sh deploy --components=controller) and undeploy again, or add --force to remove the suite anyway"
    warn "$msg; --force: going on"
  fi
  local node
  for node in $labelled; do
    info "switch the feature off: $KUBECTL label ${node} $key-"
    k label "$node" "$key-" | sed "s/^/$(ts) [INFO]   /"
  done
  info "wait for the controller's disable Jobs (timeout ${DISABLE_TIMEOUT}s)"
  deadline=$((SECONDS + DISABLE_TIMEOUT))
  while true; do
    if ! pending=$(not_disabled); then
      warn "cannot read the nodes' status; trying again"
      pending="?"
    fi
    [[ -z $pending ]] && break
    if ((SECONDS >= deadline)); then
      local hint="kubectl -n $NS get jobs -l $AGENT_JOBS; kubectl -n $NS logs job/lj-agent-<node>-disable; kubectl get node <node> -o jsonpath='{.metadata.annotations.lj-runtimekit-controller/last-action-status}'"
      while IFS=$'\t' read -r node why; do warn "  $node: $why"; done <<<"$pending"
      [[ -n $force ]] || die "the feature is still on after ${DISABLE_TIMEOUT}s on: $(cut -f1 <<<"$pending" | sort -u | tr '\n' ' ')" \
        "$hint; fix the node and undeploy again, or add --force to remove the suite anyway"
      warn "--force: removing the suite although these nodes are not disabled"
      return
    fi
    if ((SECONDS >= next_report)); then
      info "  waiting for $(cut -f1 <<<"$pending" | sort -u | wc -l) node(s): $(cut -f1 <<<"$pending" | sort -u | head -5 | tr '\n' ' ')"
      next_report=$((SECONDS + 10))
    fi
    sleep 2
  done
  info "every node is disabled"
}

# Labels and annotations of the suite left on nodes: the feature label, the device plugin's
# device labels, the components' annotations.
clean_nodes() {
  local key=${NODE_LABEL%%=*} node kind name
  local -A labels=() annotations=()
  local meta
  meta=$(node_meta) || die "cannot read the nodes' labels" "run: $KUBECTL get nodes --show-labels"
  while IFS=$'\t' read -r node kind name _; do
    [[ -n $node && -n $name ]] || continue
    if [[ $kind == label && ($name == "$key" || $name == "$OUR_LABEL_PREFIX"*) ]]; then
      labels[$node]+=" $name-"
    elif [[ $kind == annotation ]]; then
      local prefix
      for prefix in "${OUR_ANNOTATION_PREFIXES[@]}"; do
        [[ $name == "$prefix"* ]] && annotations[$node]+=" $name-"
      done
    fi
  done <<<"$meta"
  for node in "${!labels[@]}"; do
    info "node $node: remove labels${labels[$node]}"
    # shellcheck disable=SC2086
    [[ -n $dry_run ]] || k label node "$node" ${labels[$node]} >/dev/null
  done
  for node in "${!annotations[@]}"; do
    info "node $node: remove annotations${annotations[$node]}"
    # shellcheck disable=SC2086
    [[ -n $dry_run ]] || k annotate node "$node" ${annotations[$node]} >/dev/null
  done
}

undeploy() {
  local i c all=""
  ((${#selected[@]} == ${#ALL_COMPONENTS[@]})) && all=1
  if [[ -n $all ]]; then
    disable_nodes
  elif wants controller; then
    warn "undeploying the controller alone: the nodes stay as they are (enabled ones keep the" \
      "lj-runtime handler) and label changes are not acted on until it is deployed again;" \
      "to switch the feature off everywhere, undeploy all components"
  fi
  for ((i = ${#selected[@]} - 1; i >= 0; i--)); do
    c=${selected[i]}
    delete_folder "$(folder_of "$c")"
    [[ -n $dry_run ]] || k -n "$NS" wait --for=delete pod -l "app=lj-runtimekit-$c" --timeout=120s >/dev/null 2>&1 ||
      warn "pods of lj-runtimekit-$c still terminating"
  done
  if [[ -n $all ]]; then
    info "delete the agent Jobs the controller kept (failed ones)"
    k -n "$NS" delete jobs -l "$AGENT_JOBS" --ignore-not-found ${dry_run:+--dry-run=server} |
      sed "s/^/$(ts) [INFO]   /"
    delete_folder common
    info "delete the shared objects (CRDs, RuntimeClass)"
    k delete ${dry_run:+--dry-run=server} --ignore-not-found --wait=true -f "$here/crds/" |
      sed "s/^/$(ts) [INFO]   /"
    info "remove the suite's labels and annotations from the nodes"
    clean_nodes
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
  dry_run="" force=""
  local components=""
  for arg in "$@"; do
    case $arg in
      --components=*) components=${arg#--components=} ;;
      --dry-run) dry_run=1 ;;
      --force) force=1 ;;
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
  cluster
  "$action"
}

main "$@"
