{{/* The image of a component: <registry>/lj-runtimekit-<name>:<tag or version>. */}}
{{- define "ljrk.image" -}}
{{ .root.Values.registry }}/lj-runtimekit-{{ .name }}:{{ .tag | default .root.Values.version }}
{{- end -}}
