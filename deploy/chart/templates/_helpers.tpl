{{/* Labels on every object the chart makes. */}}
{{- define "hiloop.labels" -}}
app.kubernetes.io/name: hiloop
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* Labels that select hiloop's own pod. */}}
{{- define "hiloop.selectorLabels" -}}
app.kubernetes.io/name: hiloop
app.kubernetes.io/component: control-plane
{{- end }}

{{- define "hiloop.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end }}
