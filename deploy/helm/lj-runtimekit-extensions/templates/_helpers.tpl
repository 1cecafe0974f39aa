{{/*
Helpers of the lean chart: the full chart's (deploy/helm/lj-runtimekit) under the prefix
"ljrkext." so that an umbrella chart may hold both charts without their named templates meeting
(Helm's named templates are shared by a chart and its subcharts). Every template takes a dict of
"root" (the chart's top-level context) and "component" (here only device-plugin; "" for objects
all components share). tests/deploy_tests/test_plan_charts.py renders both charts and holds
their device plugin objects equal.
*/}}

{{/* The values of a component: device-plugin → .Values.devicePlugin, others by their name. */}}
{{- define "ljrkext.valuesKey" -}}
{{- if eq . "device-plugin" }}devicePlugin{{ else }}{{ . }}{{ end -}}
{{- end -}}

{{/* <chart name>-<chart version>, the value of the helm.sh/chart label. */}}
{{- define "ljrkext.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The image tag of a component: its own tag, else the release's `version`. */}}
{{- define "ljrkext.tag" -}}
{{- $v := index .root.Values (include "ljrkext.valuesKey" .component) -}}
{{- $v.tag | default .root.Values.version -}}
{{- end -}}

{{/* The image of a component: <registry>/lj-runtimekit-<name>:<tag or version>. */}}
{{- define "ljrkext.image" -}}
{{ .root.Values.registry }}/lj-runtimekit-{{ .name }}:{{ .tag | default .root.Values.version }}
{{- end -}}

{{/*
Selector labels: `app: lj-runtimekit-<component>`, exactly those of deploy/. A workload's
selector is immutable, so these must never change: `helm upgrade` from an older release (or over
objects deploy-all.sh made) would fail on the DaemonSets and Deployments.
*/}}
{{- define "ljrkext.selectorLabels" -}}
app: lj-runtimekit-{{ .component }}
{{- end -}}

{{/*
The labels of every pod template: the selector labels and the standard app.kubernetes.io ones.
Not helm.sh/chart: a new chart version alone must not restart every node's device plugin.
*/}}
{{- define "ljrkext.podLabels" -}}
{{- include "ljrkext.podLabelLines" . | trim -}}
{{- end -}}

{{- define "ljrkext.podLabelLines" -}}
{{- if .component }}
{{ include "ljrkext.selectorLabels" . }}
app.kubernetes.io/name: lj-runtimekit-{{ .component }}
app.kubernetes.io/component: {{ .component }}
{{- else }}
app.kubernetes.io/name: lj-runtimekit
{{- end }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- if and .component (ne .component "job-agent") }}
app.kubernetes.io/version: {{ include "ljrkext.tag" . | quote }}
{{- else }}
app.kubernetes.io/version: {{ .root.Values.version | quote }}
{{- end }}
app.kubernetes.io/part-of: lj-runtimekit
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{/* The labels of every object of the chart (Kubernetes' recommended labels plus Helm's). */}}
{{- define "ljrkext.labels" -}}
{{ include "ljrkext.podLabels" . }}
helm.sh/chart: {{ include "ljrkext.chart" .root }}
{{- end -}}

{{/*
The node selector of a node agent: the node label (the one place it is set, nodeLabel) plus the
component's own nodeSelector.
*/}}
{{- define "ljrkext.nodeSelector" -}}
{{- $v := index .root.Values (include "ljrkext.valuesKey" .component) -}}
{{- $sel := dict .root.Values.nodeLabel.key (toString .root.Values.nodeLabel.value) -}}
{{- toYaml (merge $sel ($v.nodeSelector | default dict)) -}}
{{- end -}}

{{/*
The pod-spec fields every workload takes from its values the same way: priority class, node
selector (cluster services: their own only), tolerations, affinity, image pull secrets.
*/}}
{{- define "ljrkext.podPlacement" -}}
{{- include "ljrkext.podPlacementLines" . | trim -}}
{{- end -}}

{{- define "ljrkext.podPlacementLines" -}}
{{- $v := index .root.Values (include "ljrkext.valuesKey" .component) -}}
{{- with $v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- if .nodeAgent }}
nodeSelector:
  {{- include "ljrkext.nodeSelector" . | nindent 2 }}
{{- else if $v.nodeSelector }}
nodeSelector:
  {{- toYaml $v.nodeSelector | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The component's config.yaml: `version: v1`, then what the chart sets in one place for every
component (keys in `set`), then the operator's `config` of the component. A key of `set` written
again in `config` is refused: two values for one setting would be resolved silently by the
component's YAML loader.
*/}}
{{- define "ljrkext.config" -}}
{{- $v := index .root.Values (include "ljrkext.valuesKey" .component) -}}
{{- $own := fromYaml ($v.config | default "") -}}
{{- if hasKey $own "Error" }}
{{- fail (printf "%s.config is not valid YAML: %s" (include "ljrkext.valuesKey" .component) (get $own "Error")) }}
{{- end }}
{{- range $key, $_ := .set }}
{{- if hasKey $own $key }}
{{- fail (printf "%s.config sets %s, which the chart sets from %s: set it there instead" (include "ljrkext.valuesKey" $.component) $key (get $.from $key)) }}
{{- end }}
{{- end }}
{{- if hasKey $own "version" }}
{{- fail (printf "%s.config sets version; the chart writes version: v1 itself" (include "ljrkext.valuesKey" .component)) }}
{{- end -}}
version: v1
{{- if .set }}
# Set by the chart from nodeLabel and resourceNames, the same for every component.
{{ toYaml .set }}
{{- end }}
{{- with $v.config }}
{{ trimSuffix "\n" . }}
{{- end }}
{{- end -}}

{{/* The resource names of values.resourceNames under the components' config keys. */}}
{{- define "ljrkext.resourceNames" -}}
{{- $r := .root.Values.resourceNames -}}
{{- toYaml (dict "resource_gpu" $r.gpu "resource_gpu_core" $r.gpuCore "resource_gpu_memory" $r.gpuMemory "resource_ppu" $r.ppu) -}}
{{- end -}}
