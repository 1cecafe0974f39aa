"""KWOK stages for the local cluster: nodes become Ready and keep the capacity they were created
with (or that the kubelet emulator patched); pods bound to KWOK nodes run; pods of Jobs complete,
with failure on demand through the pod annotation :data:`EXIT_CODE_ANNOTATION`."""

from __future__ import annotations

EXIT_CODE_ANNOTATION = "lj-runtimekit-testkit/exit-code"
"""On a Job's pod template: when present, KWOK terminates its containers with exit code 1 and the
pod fails (kwok's templates do not see the pod's annotations, so the value is not used)."""

_NODE_INITIALIZE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-initialize
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: NotIn
      values: ['True']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
      addresses:
      - {address: {{ NodeIP | Quote }}, type: InternalIP}
      - {address: {{ NodeName | Quote }}, type: Hostname}
      {{ with .status.allocatable }}
      allocatable:
      {{ YAML . 1 }}
      {{ end }}
      {{ with .status.capacity }}
      capacity:
      {{ YAML . 1 }}
      {{ end }}
      nodeInfo:
        architecture: amd64
        operatingSystem: linux
        kubeletVersion: fake
        kubeProxyVersion: fake
      phase: Running
"""

_POD_READY = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.status.phase', operator: In, values: [Pending]}
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - {lastTransitionTime: {{ $now | Quote }}, status: "True", type: Initialized}
      - {lastTransitionTime: {{ $now | Quote }}, status: "True", type: Ready}
      - {lastTransitionTime: {{ $now | Quote }}, status: "True", type: ContainersReady}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        started: true
        restartCount: 0
        state: {running: {startedAt: {{ $now | Quote }}}}
      {{ end }}
      {{ with NodeIPWith .spec.nodeName }}
      hostIP: {{ . | Quote }}
      {{ end }}
      {{ with PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) \
( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      podIP: {{ . | Quote }}
      {{ end }}
      phase: Running
      startTime: {{ $now | Quote }}
"""


def _pod_finish(name: str, operator: str, phase: str, exit_code: str, reason: str) -> str:
    return f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: {name}
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - {{key: '.metadata.deletionTimestamp', operator: DoesNotExist}}
    - {{key: '.status.phase', operator: In, values: [Running]}}
    - {{key: '.metadata.ownerReferences.[].kind', operator: In, values: [Job]}}
    - key: '.metadata.annotations.["{EXIT_CODE_ANNOTATION}"]'
      operator: {operator}
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
      - {{lastTransitionTime: {{{{ $now | Quote }}}}, status: "False", type: Ready}}
      - {{lastTransitionTime: {{{{ $now | Quote }}}}, status: "False", type: ContainersReady}}
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: false
        started: false
        restartCount: 0
        state:
          terminated:
            exitCode: {exit_code}
            reason: {reason}
            startedAt: {{{{ $now | Quote }}}}
            finishedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      phase: {phase}
"""


_POD_DELETE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: Exists}
  next:
    finalizers: {empty: true}
    delete: true
"""


def stages_yaml() -> str:
    """The multi-document KWOK config holding every stage of the local cluster."""
    complete = _pod_finish("pod-complete", "DoesNotExist", "Succeeded", "0", "Completed")
    fail = _pod_finish(
        "pod-fail",
        "Exists",
        "Failed",
        "1",
        "Error",
    )
    return "---\n".join([_NODE_INITIALIZE, _POD_READY, complete, fail, _POD_DELETE])
