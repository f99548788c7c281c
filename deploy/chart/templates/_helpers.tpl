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

{{/* hiloop's image: repository@digest when image.digest is set, else repository:tag. */}}
{{- define "hiloop.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}
{{- end }}

{{/* An address or CIDR as a CIDR: a bare address becomes a /32 or /128. */}}
{{- define "hiloop.cidr" -}}
{{- if contains "/" . }}{{ . }}{{ else if contains ":" . }}{{ . }}/128{{ else }}{{ . }}/32{{ end -}}
{{- end }}

{{/*
The sandboxes' egress exceptions of one family (dict: Values, family "ipv4"
or "ipv6"): networkPolicy.deniedCIDRs and the cluster's own networks and API
server addresses, as a YAML list.
*/}}
{{- define "hiloop.deniedCIDRs" -}}
{{- $six := eq .family "ipv6" -}}
{{- $out := list -}}
{{- $c := .Values.networkPolicy.cluster -}}
{{- range (concat (index .Values.networkPolicy.deniedCIDRs .family) $c.podCIDRs $c.serviceCIDRs $c.nodeCIDRs $c.apiServer) -}}
{{- $cidr := include "hiloop.cidr" . -}}
{{- if eq $six (contains ":" $cidr) }}{{ $out = append $out $cidr }}{{ end -}}
{{- end -}}
{{- toYaml (uniq $out) -}}
{{- end }}

{{/* Pod Security restricted, enforced, audited and warned, at the latest version. */}}
{{- define "hiloop.restricted" -}}
pod-security.kubernetes.io/enforce: restricted
pod-security.kubernetes.io/enforce-version: latest
pod-security.kubernetes.io/audit: restricted
pod-security.kubernetes.io/audit-version: latest
pod-security.kubernetes.io/warn: restricted
pod-security.kubernetes.io/warn-version: latest
{{- end }}

{{/*
The namespaces the admission bindings select: the sandbox namespace, by
kubernetes.io/metadata.name, a label the API server sets to the namespace's
name and that nobody can change or put on another namespace.
*/}}
{{- define "hiloop.bindingNamespaces" -}}
namespaceSelector:
  matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: In
    values: [{{ .Values.sandboxNamespace | quote }}]
{{- end }}

{{/*
The boundary's templates, rendered: what the self-check compares the cluster
with. The ConfigMap hiloop-boundary holds it, and `make chart` writes the
default values' rendering of the same templates to boundary/chart-boundary.yaml,
built into hiloop.
*/}}
{{- define "hiloop.boundary" -}}
{{- range list "namespaces.yaml" "runtimeclass.yaml" "admission.yaml" "networkpolicy.yaml" "quota.yaml" }}
---
{{ include (print $.Template.BasePath "/" .) $ | trim }}
{{- end }}
{{- end }}
