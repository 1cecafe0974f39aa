#!/usr/bin/env bash
# Deploys or removes LJ RuntimeKit on the cluster kubectl points at (guide §3.3).
#
#   deploy/deploy-all.sh deploy   [--components=device-plugin,scheduler,exporter,controller] [--dry-run]
#   deploy/deploy-all.sh undeploy [--components=...] [--dry-run] [--force] [--yes] [--purge]
#   deploy/deploy-all.sh verify   [--components=...]
#
# Components: device-plugin, exporter, scheduler, controller (default: all).
# Every action first says which cluster it acts on (kubectl's current context and server) and
# where its log goes. undeploy then asks before it changes anything (type "yes"); --yes answers
# for it (scripts, CI: without a terminal it refuses to run without --yes).
# An undeploy of all components first switches the feature off on every node (guide §3.5): it
# removes the node label, waits until the controller's disable Jobs have taken the lj-runtime
# handler out of each node's containerd (DISABLE_TIMEOUT), and only then deletes the controller;
# at the end no node keeps a label or annotation of the suite. --force goes on after a timeout.
# The objects other things may use, the lj-runtime RuntimeClass and the NodeDevices CRD, stay
# unless --purge is given (the NodeDevices objects of the nodes go with the device plugin).
#
# Environment:
#   lj_runtimekit_version   image tag for every component (e.g. v1.13.0); unset: the tags written
#                           in the manifests (edit them there to upgrade one component, §7.3)
#   LJ_RUNTIMEKIT_REGISTRY  image registry; unset: the registry written in the manifests
#   KUBECTL                 the kubectl to use (default: kubectl on PATH); KUBECONFIG as usual
#   LJ_RUNTIMEKIT_LOG_DIR   where the log of this run goes (default: ./lj-runtimekit-deploy-logs)
#   ROLLOUT_TIMEOUT         how long to wait for each rollout (default 300s)
#   NODE_LABEL              the feature label of the nodes to run on, key=value (default
#                           lj_runtimekit_enable=true): written into the DaemonSets' and the
#                           RuntimeClass' nodeSelector and the controller's and scheduler's
#                           ConfigMaps (the scheduler knows only the value true)
#   DISABLE_TIMEOUT         seconds an undeploy waits for the nodes to be disabled (default 600)
#
# It can be run again at any time: objects are applied, so a second run changes nothing and
# reports every object "unchanged".
# Objects shared by all components (the CRDs and the lj-runtime RuntimeClass) are applied on every
# deploy and removed only by `undeploy --purge`.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
KUBECTL=${KUBECTL:-kubectl}
NS=kube-system
DEFAULT_LABEL_KEY=lj_runtimekit_enable
DEFAULT_LABEL_VALUE=true
NODE_LABEL=${NODE_LABEL:-$DEFAULT_LABEL_KEY=$DEFAULT_LABEL_VALUE}
ROLLOUT_TIMEOUT=${ROLLOUT_TIMEOUT:-300s}
DISABLE_TIMEOUT=${DISABLE_TIMEOUT:-600}
ALL_COMPONENTS=(device-plugin exporter scheduler controller)
STATUS_ANNOTATION=lj-runtimekit-controller/last-action-status
AGENT_JOBS=app.kubernetes.io/managed-by=lj-runtimekit-controller
# What the suite writes on nodes: the device plugin's labels, the components' annotations.
OUR_LABEL_PREFIX=lj-runtimekit.aliyun.com/
OUR_ANNOTATION_PREFIXES=(lj-runtimekit-controller/ lj-runtimekit-device-plugin/ lj-runtimekit-scheduler/ lj-runtimekit-exporter/)
MIN_SERVER_MINOR=30 # ValidatingAdmissionPolicy v1 (admissionregistration.k8s.io/v1)
NODEDEVICES_CRD=nodedevices.lj-runtimekit.aliyun.com

# The comment block at the top of this file, without the '# ' and without the code after it.
usage() {
  sed -n -e '2,/^set -euo/{' -e '/^#/!q' -e 's/^# \{0,1\}//' -e 'p' -e '}' "$0"
  exit "${1:-0}"
}

ts() { date -u +%Y-%m-%dT%H:%M:%SZ; }
log() { echo "$(ts) [$1] ${*:2}"; }
info() { log INFO "$@"; }
warn() { log WARN "$@"; }
# An error: what is wrong, then what to do about it. On stderr (which is the log once it runs).
die() {
  log ERROR "$1" >&2
  [[ -z ${2:-} ]] || log HINT "$2" >&2
  exit 1
}

folder_of() { # component → manifest folder (the guide's names); main() checked the name
  case $1 in
    device-plugin) echo deviceplugin ;;
    *) echo "$1" ;;
  esac
}

# --components=a,b: every name known (said here, not in a subshell whose message is lost), each
# once, in the order given.
select_components() {
  local c k known
  local -a given
  selected=()
  [[ -n $1 ]] || die "--components is empty" \
    "name one or more of: ${ALL_COMPONENTS[*]} (comma-separated, e.g. --components=device-plugin,exporter), or leave it out for all"
  IFS=, read -r -a given <<<"$1"
  for c in "${given[@]}"; do
    known=""
    for k in "${ALL_COMPONENTS[@]}"; do [[ $c == "$k" ]] && known=1; done
    [[ -n $known ]] || die "unknown component '$c' in --components=$1" \
      "valid components: ${ALL_COMPONENTS[*]} (comma-separated, e.g. --components=device-plugin,exporter)"
    wants "$c" || selected+=("$c")
  done
}

# NODE_LABEL as key and value, checked as Kubernetes checks a label, before anything is applied:
# a label no node can carry would leave the DaemonSets running nowhere.
parse_node_label() {
  local name='[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?'
  local prefix='[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*'
  local hint="set NODE_LABEL=<key>=<value>, e.g. NODE_LABEL=lj_runtimekit_enable=true or NODE_LABEL=example.com/gpu=true"
  [[ $NODE_LABEL == *=* ]] || die "NODE_LABEL='$NODE_LABEL' has no value (expected key=value)" "$hint"
  label_key=${NODE_LABEL%%=*}
  label_value=${NODE_LABEL#*=}
  [[ $label_key =~ ^($prefix/)?$name$ && ${#label_key} -le 316 ]] ||
    die "NODE_LABEL key '$label_key' is not a valid label key" "$hint"
  [[ $label_value =~ ^$name$ ]] ||
    die "NODE_LABEL value '$label_value' is not a valid label value (non-empty, at most 63 of A-Z a-z 0-9 - _ .)" "$hint"
}

workload_of() { # component → kind/name of what rolls out
  case $1 in
    device-plugin | exporter) echo "daemonset/lj-runtimekit-$1" ;;
    scheduler | controller) echo "deployment/lj-runtimekit-$1" ;;
  esac
}

# The manifests of a folder with the image registry and tag of this run, if given, and the node
# label of NODE_LABEL wherever the manifests name the default one: the DaemonSets' and the
# RuntimeClass' nodeSelector, the scheduler's feature_label, the controller's label_key and
# label_value. (Label keys and values cannot hold '|', the sed delimiter.)
render() {
  local f
  for f in "$here/$1"/[0-9]*.yaml; do
    echo "---"
    sed -E -e "" \
      ${LJ_RUNTIMEKIT_REGISTRY:+-e "s#([\"= ])[^\"= ]+/(lj-runtimekit-[a-z-]+):#\\1${LJ_RUNTIMEKIT_REGISTRY}/\\2:#"} \
      ${lj_runtimekit_version:+-e "s#(/lj-runtimekit-[a-z-]+):[A-Za-z0-9._-]+#\\1:${lj_runtimekit_version}#"} \
      -e "/^ *#/! s|^( +)$DEFAULT_LABEL_KEY: \"$DEFAULT_LABEL_VALUE\"\$|\\1$label_key: \"$label_value\"|" \
      -e "s|^( +feature_label: )$DEFAULT_LABEL_KEY\$|\\1$label_key|" \
      -e "s|^( +label_key: )$DEFAULT_LABEL_KEY\$|\\1$label_key|" \
      -e "s|^( +label_value: )\"$DEFAULT_LABEL_VALUE\"\$|\\1\"$label_value\"|" \
      "$f"
  done
}

# The node label must reach every component that uses it; a manifest that names it some other
# way would silently keep the default, so the rendered manifests are checked before applying.
check_node_label() {
  local folder=$1 rendered=$2 want
  case $folder in
    deviceplugin | exporter | common) want="$label_key: \"$label_value\"" ;;
    scheduler) want="feature_label: $label_key" ;;
    controller) want="label_key: $label_key" ;;
    *) return 0 ;;
  esac
  grep -qF -- "$want" <<<"$rendered" ||
    die "NODE_LABEL=$NODE_LABEL did not reach deploy/$folder (no '$want' after rendering)" \
      "deploy/$folder must name the node label as '$DEFAULT_LABEL_KEY: \"$DEFAULT_LABEL_VALUE\"' (nodeSelector), feature_label or label_key/label_value; or deploy with the default NODE_LABEL"
}

k() { "$KUBECTL" "$@"; }

# Which cluster this run acts on, said before anything is changed.
cluster() {
  command -v "$KUBECTL" >/dev/null || die "kubectl not found ($KUBECTL)" \
    "install kubectl or point KUBECTL at it"
  cluster_context=$(k config current-context 2>/dev/null) || cluster_context="<none: in-cluster or KUBECONFIG without current-context>"
  cluster_server=$(k config view --minify -o jsonpath='{.clusters[0].cluster.server}' 2>/dev/null) || cluster_server=""
  info "cluster: context '$cluster_context', server ${cluster_server:-<unknown>}"
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

  if wants scheduler && [[ $label_value != true ]]; then
    die "NODE_LABEL=$NODE_LABEL: the scheduler places pods only on nodes whose label $label_key is \"true\"" \
      "use NODE_LABEL=$label_key=true, or deploy without the scheduler (--components=device-plugin,exporter,controller)"
  fi
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

# Applies a folder; $2, the component of the folder, is restarted when its ConfigMap changed:
# the components read their config once, at start.
apply_folder() {
  local rendered out
  rendered=$(render "$1")
  check_node_label "$1" "$rendered"
  info "apply deploy/$1"
  out=$(k apply ${dry_run:+--dry-run=server} -f - <<<"$rendered") ||
    die "kubectl apply of deploy/$1 failed (above)" \
      "fix what the apiserver refused, then run the script again; nothing after deploy/$1 was applied"
  sed "s/^/$(ts) [INFO]   /" <<<"$out"
  if [[ -n ${2:-} && -z $dry_run ]] && grep -q "^configmap/lj-runtimekit-$2 configured" <<<"$out"; then
    info "its ConfigMap changed: restart $(workload_of "$2") to read it"
    k -n "$NS" rollout restart "$(workload_of "$2")" | sed "s/^/$(ts) [INFO]   /"
    if [[ $2 == device-plugin ]]; then # its DRA mode reads the same ConfigMap (docs/dra.md)
      k -n "$NS" rollout restart daemonset/lj-runtimekit-dra-plugin | sed "s/^/$(ts) [INFO]   /"
    fi
  fi
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
  for c in "${selected[@]}"; do apply_folder "$(folder_of "$c")" "$c"; done
  [[ -n $dry_run ]] && { info "dry run: nothing was changed"; return; }
  for c in "${selected[@]}"; do
    info "wait for $(workload_of "$c") to roll out (timeout $ROLLOUT_TIMEOUT)"
    k -n "$NS" rollout status "$(workload_of "$c")" --timeout="$ROLLOUT_TIMEOUT" ||
      die "$(workload_of "$c") did not become ready" \
        "kubectl -n $NS describe $(workload_of "$c"); kubectl -n $NS logs -l app=lj-runtimekit-$c"
  done
  if wants device-plugin; then # the same image in DRA mode, on nodes labelled for it (docs/dra.md)
    k -n "$NS" rollout status daemonset/lj-runtimekit-dra-plugin --timeout="$ROLLOUT_TIMEOUT" ||
      die "daemonset/lj-runtimekit-dra-plugin did not become ready" \
        "kubectl -n $NS describe daemonset/lj-runtimekit-dra-plugin; kubectl -n $NS logs -l app=lj-runtimekit-dra-plugin"
  fi
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

# undeploy changes a cluster for good: it names the cluster and asks, unless --yes answered.
# Without a terminal to ask on, it refuses rather than guess.
confirm_undeploy() {
  local what="undeploy ${selected[*]}${purge:+ and the shared objects (--purge)} from context '$cluster_context' (server ${cluster_server:-<unknown>})"
  if [[ -n $assume_yes ]]; then
    info "--yes: $what"
    return
  fi
  [[ -t 0 ]] || die "not confirmed: $what needs a yes, and stdin is not a terminal to ask on" \
    "check the cluster above and run again with --yes (or --dry-run to see what it would do)"
  local answer
  read -r -p "$(ts) [ASK]  $what? Type yes to go on: " answer || answer=""
  [[ $answer == yes ]] || die "not confirmed (answer '$answer'): nothing was changed" \
    "run again and type yes, or pass --yes"
}

undeploy() {
  local i c all=""
  ((${#selected[@]} == ${#ALL_COMPONENTS[@]})) && all=1
  [[ -n $dry_run ]] || confirm_undeploy
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
    info "remove the suite's labels and annotations from the nodes"
    clean_nodes
  fi
  if [[ -n $purge ]]; then
    delete_folder common
    info "delete the shared objects (CRDs with every NodeDevices, RuntimeClass): --purge"
    k delete ${dry_run:+--dry-run=server} --ignore-not-found --wait=true -f "$here/crds/" |
      sed "s/^/$(ts) [INFO]   /"
  else
    if [[ -n $all ]] && k get crd "$NODEDEVICES_CRD" >/dev/null 2>&1; then
      info "delete the nodes' NodeDevices (the device plugin's inventory; the CRD stays)"
      k delete nodedevices --all --ignore-not-found ${dry_run:+--dry-run=server} |
        sed "s/^/$(ts) [INFO]   /"
    fi
    info "kept the shared objects (CRD $NODEDEVICES_CRD, RuntimeClass lj-runtime): other things" \
      "may use them; undeploy --purge removes them too"
  fi
  [[ -n $dry_run ]] && info "dry run: nothing was changed"
  info "undeploy done"
}

# The checks of guide §3.4, printed as a summary.
verify() {
  info "verification (guide §3.4)"
  local c failed=0
  local -a checks=()
  for c in "${selected[@]}"; do
    checks+=("$(workload_of "$c")")
    # the device plugin in DRA mode (docs/dra.md): nodes labelled for it run this one instead
    [[ $c != device-plugin ]] || checks+=(daemonset/lj-runtimekit-dra-plugin)
  done
  local w ready want dra_want
  dra_want=$(k -n "$NS" get daemonset/lj-runtimekit-dra-plugin -o jsonpath='{.status.desiredNumberScheduled}' 2>/dev/null || echo 0)
  for w in "${checks[@]}"; do
    if [[ $w == daemonset/* ]]; then
      want=$(k -n "$NS" get "$w" -o jsonpath='{.status.desiredNumberScheduled}' 2>/dev/null || echo "?")
      ready=$(k -n "$NS" get "$w" -o jsonpath='{.status.numberReady}' 2>/dev/null || echo "?")
    else
      want=$(k -n "$NS" get "$w" -o jsonpath='{.spec.replicas}' 2>/dev/null || echo "?")
      ready=$(k -n "$NS" get "$w" -o jsonpath='{.status.readyReplicas}' 2>/dev/null || echo "?")
    fi
    ready=${ready:-0}
    if [[ $w == daemonset/lj-runtimekit-dra-plugin && $want == 0 ]] ||
      [[ $w == daemonset/lj-runtimekit-device-plugin && $want == 0 && ${dra_want:-0} != 0 ]]; then
      # no node in this mode: fine while the other mode covers the labelled nodes
      printf '%s [INFO]   %-32s ready 0/0: no node in this mode\n' "$(ts)" "$w"
    elif [[ $w == daemonset/* && $want == 0 ]]; then
      # 0/0 is no success: the node agent runs nowhere.
      printf '%s [WARN]   %-32s ready 0/0: on no node (nodeSelector %s)\n' "$(ts)" "$w" \
        "$(k -n "$NS" get "$w" -o jsonpath='{.spec.template.spec.nodeSelector}' 2>/dev/null || echo '?')"
      failed=1
    elif [[ $want != "?" && $ready == "$want" ]]; then
      printf '%s [INFO]   %-32s ready %s/%s\n' "$(ts)" "$w" "$ready" "$want"
    else
      printf '%s [WARN]   %-32s ready %s/%s\n' "$(ts)" "$w" "$ready" "$want"
      failed=1
    fi
  done
  info "pods:"
  k -n "$NS" get pods -o wide -l 'app in (lj-runtimekit-device-plugin,lj-runtimekit-dra-plugin,lj-runtimekit-scheduler,lj-runtimekit-exporter,lj-runtimekit-controller)' |
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

# Said last, whatever the outcome, so the log is found without scrolling back.
finish() {
  local rc=$?
  info "log: $logfile"
  # Let tee write everything before the caller sees the script end.
  exec >&- 2>&-
  wait "$tee_pid" 2>/dev/null || true
  exit "$rc"
}

main() {
  [[ $# -ge 1 ]] || usage 2
  local action=$1 arg
  shift
  case $action in
    deploy | undeploy | verify) ;;
    -h | --help | help) usage 0 ;;
    *) die "unknown action '$action'" "use deploy, undeploy or verify (deploy-all.sh --help)" ;;
  esac
  dry_run="" force="" assume_yes="" purge=""
  local components="" components_given=""
  for arg in "$@"; do
    case $arg in
      --components=*) components=${arg#--components=} components_given=1 ;;
      --dry-run) dry_run=1 ;;
      --force) force=1 ;;
      --yes | -y) assume_yes=1 ;;
      --purge) purge=1 ;;
      -h | --help) usage 0 ;;
      *) die "unknown argument '$arg' for $action" \
        "options: --components=<list> --dry-run, and for undeploy --force --yes --purge (deploy-all.sh --help)" ;;
    esac
  done
  [[ -z $purge || $action == undeploy ]] || die "--purge is an option of undeploy, not of $action" \
    "run deploy-all.sh undeploy --purge to remove the shared objects too"
  if [[ -n $components_given ]]; then
    select_components "$components"
  else
    selected=("${ALL_COMPONENTS[@]}")
  fi
  [[ -z $purge || ${#selected[@]} == "${#ALL_COMPONENTS[@]}" ]] ||
    die "--purge removes the objects all components share: it needs an undeploy of all components" \
      "leave out --components, or leave out --purge"
  parse_node_label

  local log_dir=${LJ_RUNTIMEKIT_LOG_DIR:-./lj-runtimekit-deploy-logs}
  mkdir -p "$log_dir" || die "cannot create the log directory $log_dir" \
    "set LJ_RUNTIMEKIT_LOG_DIR to a writable directory"
  logfile="$log_dir/$action-$(date -u +%Y%m%dT%H%M%SZ)-$$.log"
  exec > >(tee -a "$logfile") 2>&1
  tee_pid=$!
  trap finish EXIT
  info "log: $logfile"
  info "deploy-all.sh $action components=${selected[*]}${dry_run:+ (dry run)} node label $label_key=$label_value"
  info "images: registry=${LJ_RUNTIMEKIT_REGISTRY:-<as in the manifests>} version=${lj_runtimekit_version:-<as in the manifests>}"
  cluster
  "$action"
}

main "$@"
