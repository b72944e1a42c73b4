{{/* Names and labels. */}}
{{- define "coll.fullname" -}}
{{- printf "%s" .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{- define "coll.service" -}}
{{- include "coll.fullname" . -}}
{{- end -}}

{{- define "coll.labels" -}}
app.kubernetes.io/name: coll-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "coll.selector" -}}
app.kubernetes.io/name: coll-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The headless service's FQDN, with the trailing dot (no search-list walk). */}}
{{- define "coll.serviceFQDN" -}}
{{- printf "%s.%s.svc.%s." (include "coll.service" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/*
The agent's config (coll-agent --check-config accepts it; test_chart checks that for
every ci/ values file). ${...} are the downward-API variables the sidecar's env sets.
*/}}
{{- define "coll.agentConfig" -}}
agent:
  socket: /run/coll/agent.sock
  socket_mode: 0660
  allowed_gids: [{{ .Values.security.fsGroup }}]
  log_level: {{ .Values.agent.logLevel }}
  log_format: {{ .Values.agent.logFormat }}
  drain_ms: {{ .Values.agent.drainMs }}
node:
  index: auto
  name: ${POD_NAME}
  address: ${POD_IP}
  uid: ${POD_UID}
  labels_file: /etc/podinfo/labels
  data_port: {{ .Values.agent.ports.data }}
discovery:
  mode: kubernetes
  coordinator: "{{ include "coll.fullname" . }}-0.{{ include "coll.serviceFQDN" . }}:{{ .Values.agent.ports.rendezvous }}"
  service: "{{ include "coll.serviceFQDN" . }}"
http:
  address: 0.0.0.0
  port: {{ .Values.agent.ports.http }}
{{- if .Values.security.curveKeysSecret }}
security:
  keys: /etc/coll/keys
  require_keys: true
{{- end }}
groups:
{{- range .Values.groups }}
  - name: {{ .name }}
    backend: {{ .backend | default "auto" }}
    members: {{ $.Values.workload.replicas }}
    local_slots: {{ .localSlots | default 1 }}
    {{- with .devices }}
    devices: {{ toJson . }}
    {{- end }}
    {{- with .timeouts }}
    timeouts: {op_ms: {{ .opMs | default 30000 }}, heartbeat_ms: {{ .heartbeatMs | default 1000 }}, join_ms: {{ .joinMs | default 60000 }}}
    {{- end }}
{{- end }}
{{- end -}}

{{/*
The sidecar: add it to a pod's initContainers (a native sidecar: restartPolicy Always),
with coll.volumes in its volumes, and coll.appMounts and coll.appEnv in the
application's container.
*/}}
{{- define "coll.sidecar" -}}
- name: coll-agent
  image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  restartPolicy: Always
  args: ["--config", "/etc/coll/agent.yaml"]
  env:
    - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
    - {name: POD_UID, valueFrom: {fieldRef: {fieldPath: metadata.uid}}}
    - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
  ports:
    - {name: rendezvous, containerPort: {{ .Values.agent.ports.rendezvous }}, protocol: TCP}
    - {name: data, containerPort: {{ .Values.agent.ports.data }}, protocol: TCP}
    - {name: http, containerPort: {{ .Values.agent.ports.http }}, protocol: TCP}
  startupProbe:
    httpGet: {path: /livez, port: http}
    periodSeconds: 1
    failureThreshold: 30
  livenessProbe:
    httpGet: {path: /livez, port: http}
    periodSeconds: 10
  readinessProbe:
    httpGet: {path: /readyz, port: http}
    periodSeconds: 2
  securityContext:
    runAsNonRoot: true
    runAsUser: {{ .Values.security.runAsUser }}
    runAsGroup: {{ .Values.security.fsGroup }}
    readOnlyRootFilesystem: true
    allowPrivilegeEscalation: false
    capabilities: {drop: [ALL]}
    seccompProfile: {type: RuntimeDefault}
  {{- with .Values.agent.resources }}
  resources: {{ toJson . }}
  {{- end }}
  {{- if eq .Values.gpu.mode "dra" }}
  resources:
    claims: [{name: gpu}]
  {{- end }}
  volumeMounts:
    - {name: coll-socket, mountPath: /run/coll}
    - {name: coll-config, mountPath: /etc/coll/agent.yaml, subPath: agent.yaml, readOnly: true}
    - {name: podinfo, mountPath: /etc/podinfo, readOnly: true}
    - {name: dshm, mountPath: /dev/shm}
    {{- if .Values.security.curveKeysSecret }}
    - {name: coll-keys, mountPath: /etc/coll/keys, readOnly: true}
    {{- end }}
{{- end -}}

{{- define "coll.volumes" -}}
- name: coll-socket
  emptyDir: {}
- name: dshm
  emptyDir: {medium: Memory}
- name: coll-config
  configMap: {name: {{ include "coll.fullname" . }}-config}
- name: podinfo
  downwardAPI:
    items:
      - {path: labels, fieldRef: {fieldPath: metadata.labels}}
{{- if .Values.security.curveKeysSecret }}
- name: coll-keys
  secret: {secretName: {{ .Values.security.curveKeysSecret }}, defaultMode: 0440}
{{- end }}
{{- end -}}

{{/* The application's env: libcoll trusts an agent of another uid only when told. */}}
{{- define "coll.appEnv" -}}
- {name: COLL_AGENT_UIDS, value: {{ .Values.security.runAsUser | quote }}}
{{- end -}}

{{- define "coll.appMounts" -}}
- {name: coll-socket, mountPath: /run/coll}
- {name: dshm, mountPath: /dev/shm}
{{- end -}}
