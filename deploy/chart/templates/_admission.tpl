{{/*
The isolation rules of the admission policies (admission.yaml). They are an
allowlist: a sandbox's pod may have exactly the shape hiloop renders
(k8s/render.go), plus what the API server itself adds to a pod, and nothing
else. Each message starts with the rule's id in brackets; hiloop's
self-check looks for the ids, and docs/install.md explains each rule.

The rules read the pod spec as a dynamic value (dyn), so that the allowlists
can range over its keys: a field this chart does not know, from a newer
Kubernetes or Sandbox CRD, is refused, not let through.

"hiloop.podRules" takes a dict: Values, and kind "sandbox" (a Sandbox's pod
template, in variables.spec) or "pod" (a pod in the sandbox namespace).
Only the first rule a request breaks is named in the refusal, so the rules
on the Sandbox's own fields and the catch-alls come after the specific ones.
*/}}

{{/* Pod Security baseline's allowed capabilities, sysctls and SELinux types. */}}
{{- define "hiloop.baselineCapabilities" -}}
["AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"]
{{- end }}
{{- define "hiloop.safeSysctls" -}}
["kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"]
{{- end }}
{{- define "hiloop.seLinuxTypes" -}}
["", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"]
{{- end }}

{{/* The label and annotation keys hiloop puts on a pod template. */}}
{{- define "hiloop.podLabelKeys" -}}
["hiloop.dev/org", "hiloop.dev/sandbox", "app.kubernetes.io/managed-by"]
{{- end }}
{{- define "hiloop.podAnnotationKeys" -}}
["hiloop.dev/runtime-receipt", "hiloop.dev/gateway-key"]
{{- end }}

{{/*
The node selector and tolerations a sandbox's pod may carry: the values'
own, and those of the gVisor RuntimeClass's scheduling block, which the
RuntimeClass admission plugin adds to every pod that names it.
*/}}
{{- define "hiloop.allowedNodeSelector" -}}
{{- $sel := dict -}}
{{- range $k, $v := .Values.admission.nodeSelector }}{{ $_ := set $sel $k (toString $v) }}{{ end -}}
{{- range $k, $v := (dig "scheduling" "nodeSelector" dict .Values.gvisor) }}{{ $_ := set $sel $k (toString $v) }}{{ end -}}
{{- toJson $sel -}}
{{- end }}
{{- define "hiloop.allowedTolerations" -}}
{{- $out := list -}}
{{- range (concat .Values.admission.tolerations (dig "scheduling" "tolerations" list .Values.gvisor)) -}}
{{- $secs := "" }}{{ if hasKey . "tolerationSeconds" }}{{ $secs = printf "%v" (int64 .tolerationSeconds) }}{{ end -}}
{{- $out = append $out (printf "%s|%s|%s|%s|%s" (.key | default "") (.operator | default "Equal") (.value | default "") (.effect | default "") $secs) -}}
{{- end -}}
{{- toJson $out -}}
{{- end }}

{{/*
The variables both policies define: spec (the pod spec), containers (every
container: regular, init and ephemeral), annotations (the pod's or the
template's), name (the Sandbox's or the pod's name).
*/}}
{{- define "hiloop.podVariables" -}}
{{- if eq .kind "sandbox" }}
- name: template
  expression: "dyn(object.spec.podTemplate)"
- name: spec
  expression: "variables.template.spec"
- name: annotations
  expression: "variables.template.?metadata.?annotations.orValue({})"
- name: claims
  expression: "dyn(object.spec).?volumeClaimTemplates.orValue([])"
{{- else }}
- name: spec
  expression: "dyn(object.spec)"
- name: annotations
  expression: "dyn(object.metadata).?annotations.orValue({})"
{{- end }}
- name: name
  expression: "object.metadata.?name.orValue('')"
- name: containers
  expression: >-
    variables.spec.?containers.orValue([]) + variables.spec.?initContainers.orValue([])
    + variables.spec.?ephemeralContainers.orValue([])
- name: podFields
  expression: >-
    variables.spec.filter(k, !(k in ['containers', 'initContainers', 'ephemeralContainers', 'volumes', 'restartPolicy',
    'automountServiceAccountToken', 'enableServiceLinks', 'runtimeClassName', 'serviceAccountName', 'serviceAccount',
    'nodeSelector', 'tolerations', 'priorityClassName', 'priority', 'preemptionPolicy', 'securityContext',
    'hostNetwork', 'hostPID', 'hostIPC', 'hostUsers', 'shareProcessNamespace', 'terminationGracePeriodSeconds',
    'activeDeadlineSeconds', 'dnsPolicy', 'schedulerName', 'overhead', 'nodeName']))
    + (variables.spec.?dnsPolicy.orValue('ClusterFirst') == 'ClusterFirst' ? [] : ['dnsPolicy'])
    + (variables.spec.?schedulerName.orValue('default-scheduler') == 'default-scheduler' ? [] : ['schedulerName'])
    + dyn(variables.spec.?securityContext.orValue({})).filter(k, !(k in ['runAsUser', 'runAsGroup', 'runAsNonRoot',
    'supplementalGroups', 'supplementalGroupsPolicy', 'fsGroup', 'fsGroupChangePolicy', 'seccompProfile',
    'appArmorProfile', 'seLinuxOptions', 'seLinuxChangePolicy', 'sysctls', 'windowsOptions'])).map(k, 'securityContext.' + k)
{{- end }}

{{- define "hiloop.podRules" -}}
{{- $v := .Values -}}
{{- $sandbox := eq .kind "sandbox" -}}
{{- if $v.gvisor.required }}
- expression: "has(variables.spec.runtimeClassName) && variables.spec.runtimeClassName == '{{ $v.gvisor.runtimeClass }}'"
  message: "[runtime-class] a sandbox must run under the {{ $v.gvisor.runtimeClass }} runtime class"
{{- end }}
- expression: >-
    variables.spec.?hostNetwork.orValue(false) == false && variables.spec.?hostPID.orValue(false) == false
    && variables.spec.?hostIPC.orValue(false) == false
  message: "[host-namespaces] a sandbox must not share the node's network, PID or IPC namespace"
- expression: >-
    variables.spec.?securityContext.?windowsOptions.?hostProcess.orValue(false) == false
    && variables.containers.all(c, c.?securityContext.?windowsOptions.?hostProcess.orValue(false) == false)
  message: "[host-process] no container of a sandbox may be a Windows HostProcess container"
- expression: >-
    variables.spec.?automountServiceAccountToken.orValue(true) == false
    && variables.spec.?volumes.orValue([]).all(v, v.?projected.?sources.orValue([]).all(s, !has(s.serviceAccountToken)))
  message: "[service-account-token] a sandbox must not mount a service account token"
- expression: "variables.containers.all(c, c.?securityContext.?privileged.orValue(false) == false)"
  message: "[privileged] no container of a sandbox may be privileged"
- expression: >-
    variables.containers.all(c, c.?securityContext.?capabilities.?add.orValue([]).all(cap,
    cap in {{ include "hiloop.baselineCapabilities" . }}))
  message: "[capabilities] a container may add only the capabilities Pod Security baseline allows"
- expression: "variables.containers.all(c, c.?ports.orValue([]).all(p, p.?hostPort.orValue(0) == 0))"
  message: "[host-ports] no container of a sandbox may use a host port"
- expression: >-
    variables.containers.all(c,
    c.?livenessProbe.?httpGet.?host.orValue('') == '' && c.?livenessProbe.?tcpSocket.?host.orValue('') == ''
    && c.?readinessProbe.?httpGet.?host.orValue('') == '' && c.?readinessProbe.?tcpSocket.?host.orValue('') == ''
    && c.?startupProbe.?httpGet.?host.orValue('') == '' && c.?startupProbe.?tcpSocket.?host.orValue('') == ''
    && c.?lifecycle.?postStart.?httpGet.?host.orValue('') == '' && c.?lifecycle.?postStart.?tcpSocket.?host.orValue('') == ''
    && c.?lifecycle.?preStop.?httpGet.?host.orValue('') == '' && c.?lifecycle.?preStop.?tcpSocket.?host.orValue('') == '')
  message: "[probe-host] no probe or lifecycle hook may name a host: the kubelet would connect to it from the node"
- expression: >-
    variables.spec.?securityContext.?seccompProfile.?type.orValue('') != 'Unconfined'
    && variables.containers.all(c, c.?securityContext.?seccompProfile.?type.orValue('') != 'Unconfined')
  message: "[seccomp] no container of a sandbox may run without a seccomp profile (Unconfined)"
- expression: >-
    variables.spec.?securityContext.?appArmorProfile.?type.orValue('') != 'Unconfined'
    && variables.containers.all(c, c.?securityContext.?appArmorProfile.?type.orValue('') != 'Unconfined')
    && variables.annotations.all(k, !k.startsWith('container.apparmor.security.beta.kubernetes.io/')
    || variables.annotations[k] == 'runtime/default' || variables.annotations[k].startsWith('localhost/'))
  message: "[apparmor] no container of a sandbox may run without an AppArmor profile (Unconfined)"
- expression: >-
    variables.spec.?securityContext.?seLinuxOptions.?type.orValue('') in {{ include "hiloop.seLinuxTypes" . }}
    && variables.spec.?securityContext.?seLinuxOptions.?user.orValue('') == ''
    && variables.spec.?securityContext.?seLinuxOptions.?role.orValue('') == ''
    && variables.containers.all(c, c.?securityContext.?seLinuxOptions.?type.orValue('') in {{ include "hiloop.seLinuxTypes" . }}
    && c.?securityContext.?seLinuxOptions.?user.orValue('') == '' && c.?securityContext.?seLinuxOptions.?role.orValue('') == '')
  message: "[selinux] a sandbox may set only the SELinux types Pod Security baseline allows, and no SELinux user or role"
- expression: "variables.containers.all(c, c.?securityContext.?procMount.orValue('Default') == 'Default')"
  message: "[proc-mount] no container of a sandbox may unmask /proc"
- expression: >-
    variables.spec.?securityContext.?sysctls.orValue([]).all(s, s.name in {{ include "hiloop.safeSysctls" . }})
  message: "[sysctls] a sandbox may set only the sysctls Pod Security baseline counts as safe"
- expression: >-
    variables.spec.?volumes.orValue([]).all(v,
    (v.name == 'hiloop-gateway-key' && dyn(v).all(k, k in ['name', 'downwardAPI'])
    && dyn(v.downwardAPI).all(k, k in ['items', 'defaultMode']) && size(v.downwardAPI.?items.orValue([])) == 1
    && dyn(v.downwardAPI.items[0]).all(k, k in ['path', 'fieldRef', 'mode'])
    && v.downwardAPI.items[0].path == 'gateway.pub'
    && v.downwardAPI.items[0].?fieldRef.?fieldPath.orValue('') == "metadata.annotations['hiloop.dev/gateway-key']")
    || (dyn(v).all(k, k in ['name', 'persistentVolumeClaim'])
    && v.?persistentVolumeClaim.?claimName.orValue('') == v.name + '-' + variables.name
    && variables.name.matches('^sbx-[a-z0-9]+$')
    {{- if $sandbox }}
    && variables.claims.exists(t, t.?metadata.?name.orValue('') == v.name)
    {{- end }}))
  message: "[volumes] a sandbox's only volumes are persistentVolumeClaims from its own claim templates and the session helper's downwardAPI volume of the gateway key"
- expression: >-
    variables.containers.all(c, c.?volumeMounts.orValue([]).all(m, dyn(m).all(k, k in ['name', 'mountPath', 'readOnly', 'recursiveReadOnly', 'mountPropagation'])
    && m.?mountPropagation.orValue('None') == 'None'))
  message: "[volume-mounts] a container mounts whole volumes: no subPath or subPathExpr (the kubelet resolves them on the node), no mount propagation"
- expression: >-
    variables.containers.all(c, !has(c.envFrom)
    && c.?env.orValue([]).all(e, dyn(e).all(k, k in ['name', 'value'])
    || (c.name == 'session-helper' && dyn(e).all(k, k in ['name', 'valueFrom'])
    && dyn(e.valueFrom).all(k, k == 'fieldRef') && e.valueFrom.?fieldRef.?fieldPath.orValue('').startsWith('metadata.'))))
  message: "[env] a container's environment is plain values (the session helper's also the pod's own metadata): no valueFrom (Secret, ConfigMap, resource, file or node field), no envFrom"
- expression: >-
    !has(variables.spec.resourceClaims)
    && variables.containers.all(c, !has(c.volumeDevices) && !has(c.?resources.orValue({}).claims))
  message: "[devices] a sandbox may claim no devices: no resourceClaims, no volumeDevices"
- expression: >-
    {{- if $sandbox }}
    variables.spec.?nodeName.orValue('') == ''
    {{- else }}
    request.operation != 'CREATE' || variables.spec.?nodeName.orValue('') == ''
    {{- end }}
  message: "[node-name] a sandbox may not name its node (nodeName skips the scheduler)"
- expression: >-
    variables.spec.?priorityClassName.orValue('') == ''
    || variables.spec.priorityClassName in {{ toJson $v.admission.priorityClassNames }}
  message: "[priority-class] a sandbox may name only the priority classes in the chart's admission.priorityClassNames"
- expression: >-
    variables.spec.?tolerations.orValue([]).all(t, dyn(t).all(k, k in ['key', 'operator', 'value', 'effect', 'tolerationSeconds'])
    && ((t.?key.orValue('') in ['node.kubernetes.io/not-ready', 'node.kubernetes.io/unreachable']
    && t.?operator.orValue('') == 'Exists' && t.?effect.orValue('') == 'NoExecute' && !has(t.value))
    || (t.?key.orValue('') + '|' + t.?operator.orValue('Equal') + '|' + t.?value.orValue('') + '|' + t.?effect.orValue('')
    + '|' + (has(t.tolerationSeconds) ? string(t.tolerationSeconds) : '')) in {{ include "hiloop.allowedTolerations" . }}))
  message: "[tolerations] a sandbox may tolerate only the taints in the chart's admission.tolerations (and the API server's default not-ready and unreachable tolerations)"
- expression: >-
    dyn(variables.spec.?nodeSelector.orValue({})).all(k, k in {{ include "hiloop.allowedNodeSelector" . }}
    && variables.spec.nodeSelector[k] == {{ include "hiloop.allowedNodeSelector" . }}[k])
  message: "[node-selector] a sandbox may select nodes only by the labels in the chart's admission.nodeSelector"
- expression: "variables.spec.?shareProcessNamespace.orValue(false) == false"
  message: "[share-process-namespace] the containers of a sandbox may not share a process namespace"
- expression: "size(variables.podFields) == 0"
  messageExpression: >-
    '[pod-fields] a sandbox\'s pod spec may set only the fields hiloop renders or the API server adds; not admitted: '
    + variables.podFields.join(', ')
  message: "[pod-fields] a sandbox's pod spec may set only the fields hiloop renders or the API server adds (dnsPolicy ClusterFirst, the default scheduler)"
- expression: >-
    variables.containers.all(c, dyn(c).all(k, k in ['name', 'image', 'command', 'args', 'workingDir', 'env', 'ports',
    'resources', 'volumeMounts', 'securityContext', 'imagePullPolicy', 'terminationMessagePath', 'terminationMessagePolicy',
    'stdin', 'stdinOnce', 'tty', 'livenessProbe', 'readinessProbe', 'startupProbe', 'lifecycle', 'resizePolicy',
    'targetContainerName'])
    && dyn(c.?securityContext.orValue({})).all(k, k in ['allowPrivilegeEscalation', 'appArmorProfile', 'capabilities',
    'privileged', 'procMount', 'readOnlyRootFilesystem', 'runAsGroup', 'runAsNonRoot', 'runAsUser', 'seLinuxOptions',
    'seccompProfile', 'windowsOptions']))
  message: "[container-fields] a container may set only the fields hiloop renders or the API server adds, and those that carry no privilege (command, probes, ports, resources)"
{{- if $sandbox }}
- expression: >-
    variables.template.all(k, k in ['metadata', 'spec'])
    && variables.template.?metadata.orValue({}).all(k, k in ['labels', 'annotations'])
    && variables.template.?metadata.?labels.orValue({}).all(k, k in {{ include "hiloop.podLabelKeys" . }})
    && variables.annotations.all(k, k in {{ include "hiloop.podAnnotationKeys" . }})
  message: "[pod-metadata] a pod template carries only hiloop's labels (org, sandbox, managed-by) and annotations (runtime receipt, gateway key)"
{{- else }}
- expression: >-
    request.operation != 'CREATE'
    || variables.annotations.all(k, k in {{ include "hiloop.podAnnotationKeys" . }} || k.startsWith('agents.x-k8s.io/'))
  message: "[pod-metadata] a sandbox's pod is created with only hiloop's annotations (runtime receipt, gateway key) and the agent-sandbox controller's"
{{- end }}
- expression: >-
    variables.containers.all(c, c.name != 'session-helper' || (has(c.securityContext)
    && c.securityContext.?readOnlyRootFilesystem.orValue(false) == true
    && c.securityContext.?allowPrivilegeEscalation.orValue(true) == false
    && c.securityContext.?runAsNonRoot.orValue(false) == true
    && c.securityContext.?runAsUser.orValue(1) != 0
    && 'ALL' in c.securityContext.?capabilities.?drop.orValue([])
    && size(c.securityContext.?capabilities.?add.orValue([])) == 0
    && c.securityContext.?seccompProfile.?type.orValue('') == 'RuntimeDefault'))
  message: "[helper-hardened] the session helper must run read-only, non-root, without capabilities or privilege escalation, under RuntimeDefault seccomp"
{{- end }}

{{/*
The rules on a Sandbox's own fields, after the pod rules: its name, its
fields, its claim templates, and on UPDATE the immutable pod template.
*/}}
{{- define "hiloop.sandboxRules" -}}
{{- $c := .Values.admission.claims -}}
- expression: "object.metadata.name.matches('^sbx-[a-z0-9]+$')"
  message: "[sandbox-name] a Sandbox is named as hiloop names it (sbx- and lower-case letters and digits), so that its claims' names cannot be another Sandbox's"
- expression: >-
    request.operation != 'CREATE' || (dyn(object.metadata).?labels.orValue({}).all(k, k in {{ include "hiloop.podLabelKeys" . }})
    && !has(object.metadata.annotations) && !has(object.metadata.ownerReferences) && !has(object.metadata.finalizers))
  message: "[sandbox-metadata] a Sandbox is created with only hiloop's labels: no annotations (the controller's pod-name, say), owner references or finalizers"
- expression: >-
    dyn(object.spec).all(k, k in ['podTemplate', 'volumeClaimTemplates', 'service', 'operatingMode', 'shutdownTime', 'shutdownPolicy'])
    && object.spec.?service.orValue(false) == false
  message: "[sandbox-fields] a Sandbox sets only its pod template, claim templates, operating mode and shutdown, and asks for no Service"
- expression: >-
    variables.claims.all(t, !t.?spec.?storageClassName.hasValue()
    || t.spec.storageClassName in {{ toJson $c.storageClasses }})
  message: "[storage-class] a claim template names no storage class (the cluster's default) or one in the chart's admission.claims.storageClasses"
- expression: >-
    size(variables.claims) <= {{ int $c.maxCount }}
    && variables.claims.all(t,
    t.spec.?resources.orValue({}).all(k, k == 'requests')
    && t.spec.?resources.?requests.orValue({}).all(k, k == 'storage')
    && t.spec.?resources.?requests.?storage.hasValue() && isQuantity(string(t.spec.resources.requests.storage))
    && quantity(string(t.spec.resources.requests.storage)).compareTo(quantity('{{ $c.maxSize }}')) <= 0)
  message: "[claim-size] a Sandbox has at most {{ int $c.maxCount }} claim templates, each requesting storage of at most {{ $c.maxSize }} and nothing else"
- expression: >-
    variables.claims.all(t, t.all(k, k in ['metadata', 'spec'])
    && t.?metadata.orValue({}).all(k, k in ['name', 'labels'])
    && t.?metadata.?labels.orValue({}).all(k, k in {{ include "hiloop.podLabelKeys" . }})
    && !t.?metadata.?name.orValue('hiloop-').startsWith('hiloop-')
    && t.spec.all(k, k in ['accessModes', 'resources', 'storageClassName', 'volumeMode'])
    && t.spec.?volumeMode.orValue('Filesystem') == 'Filesystem')
  message: "[claim-templates] a claim template is a new, empty filesystem claim: no volumeName, dataSource, dataSourceRef, selector or volume attributes class, no annotations, only hiloop's labels, and a name not starting with hiloop-"
- expression: >-
    request.operation != 'UPDATE' || (
    object.spec.podTemplate.spec == oldObject.spec.podTemplate.spec
    && variables.template.?metadata.?labels.orValue({}) == dyn(oldObject.spec.podTemplate).?metadata.?labels.orValue({})
    && dyn(object.spec).all(k, k in ['operatingMode', 'shutdownTime', 'shutdownPolicy', 'podTemplate']
    || (k in dyn(oldObject.spec) && dyn(object.spec)[k] == dyn(oldObject.spec)[k]))
    && dyn(oldObject.spec).all(k, k in ['operatingMode', 'shutdownTime', 'shutdownPolicy', 'podTemplate'] || k in dyn(object.spec)))
  message: "[immutable] after create, a Sandbox's spec changes only in operatingMode, shutdownTime, shutdownPolicy and the pod template's annotations"
{{- end }}

{{/*
hiloop's own write vocabulary, checked for its ServiceAccount: it creates
Sandboxes and merge-patches them without naming a field manager. A
server-side apply needs one, so a stolen token cannot apply, nor take fields
over under another manager's name. (The API server hands admission a patch
as an update; a PUT is outside hiloop's RBAC.)
*/}}
{{- define "hiloop.writeVocabularyRule" -}}
- expression: >-
    request.userInfo.username != 'system:serviceaccount:{{ .Values.namespace }}:hiloop'
    || request.options.?fieldManager.orValue('') == ''
  message: "[write-vocabulary] hiloop's service account creates and merge-patches Sandboxes without a field manager: no server-side apply, no field manager of its own choosing"
{{- end }}
