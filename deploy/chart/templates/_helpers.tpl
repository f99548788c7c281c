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

{{/*
The isolation rules every sandbox pod spec must meet, shared by the policy on
Sandbox objects and the one on pods. Each message starts with the rule's id
in brackets; hiloop's self-check looks for every id.
*/}}
{{- define "hiloop.isolationRules" -}}
{{- if .Values.gvisor.required }}
- expression: "has(variables.spec.runtimeClassName) && variables.spec.runtimeClassName == '{{ .Values.gvisor.runtimeClass }}'"
  message: "[runtime-class] a sandbox must run under the {{ .Values.gvisor.runtimeClass }} runtime class"
{{- end }}
- expression: "!(has(variables.spec.hostNetwork) && variables.spec.hostNetwork) && !(has(variables.spec.hostPID) && variables.spec.hostPID) && !(has(variables.spec.hostIPC) && variables.spec.hostIPC)"
  message: "[host-namespaces] a sandbox must not share the node's network, PID or IPC namespace"
- expression: "has(variables.spec.automountServiceAccountToken) && variables.spec.automountServiceAccountToken == false && (!has(variables.spec.volumes) || variables.spec.volumes.all(v, !has(v.projected) || !has(v.projected.sources) || v.projected.sources.all(s, !has(s.serviceAccountToken))))"
  message: "[service-account-token] a sandbox must not mount a service account token"
- expression: "variables.containers.all(c, !has(c.securityContext) || !has(c.securityContext.privileged) || c.securityContext.privileged == false)"
  message: "[privileged] no container of a sandbox may be privileged"
- expression: >-
    variables.containers.all(c, c.name != 'session-helper' || (has(c.securityContext)
    && has(c.securityContext.readOnlyRootFilesystem) && c.securityContext.readOnlyRootFilesystem == true
    && has(c.securityContext.allowPrivilegeEscalation) && c.securityContext.allowPrivilegeEscalation == false
    && has(c.securityContext.runAsNonRoot) && c.securityContext.runAsNonRoot == true
    && (!has(c.securityContext.runAsUser) || c.securityContext.runAsUser != 0)
    && has(c.securityContext.capabilities) && has(c.securityContext.capabilities.drop) && 'ALL' in c.securityContext.capabilities.drop
    && (!has(c.securityContext.capabilities.add) || size(c.securityContext.capabilities.add) == 0)
    && has(c.securityContext.seccompProfile) && c.securityContext.seccompProfile.type == 'RuntimeDefault'))
  message: "[helper-hardened] the session helper must run read-only, non-root, without capabilities or privilege escalation, under RuntimeDefault seccomp"
{{- end }}

{{/* The containers of a pod spec held in variables.spec, init containers included. */}}
{{- define "hiloop.containersVariable" -}}
- name: containers
  expression: "variables.spec.containers + (has(variables.spec.initContainers) ? variables.spec.initContainers : [])"
{{- end }}
