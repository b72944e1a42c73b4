{{/*
Names and labels. The workload's name is the release's (fullnameOverride instead), cut so
that every name Kubernetes derives from it stays a valid DNS label of 63 characters at
most, up to 4096 pods: a StatefulSet's pods and revision label (52), a JobSet's
<name>-workers-<job>-<index> hostnames (45), a LeaderWorkerSet's <name>-<group> worker
StatefulSets (47), a PyTorchJob's <name>-coordinator hostname and <name>-worker-<i>
pods (51).
*/}}
{{/*
The named templates a parent chart calls for its own pods (coll.sidecar, coll.volumes,
coll.appEnv, coll.appMounts; docs/kubernetes.md section 4) need this chart's scope: its
values, release and chart. Given the parent's own (`.`), they take this chart's from
.Subcharts; the parent may also pass it: (index .Subcharts "coll-agent"), or the alias
it gave the dependency. "true" where . is this chart's scope already.
*/}}
{{- define "coll.scopeCheck" -}}
{{- if hasKey .Values "agent" -}}true
{{- else if hasKey (.Subcharts | default dict) "coll-agent" -}}
{{- else -}}
{{- fail "the coll-agent templates need the chart's scope: include \"coll.sidecar\" (index .Subcharts \"<the dependency's name or alias>\")" -}}
{{- end -}}
{{- end -}}

{{- define "coll.fullname" -}}
{{- $max := get (dict "StatefulSet" 52 "IndexedJob" 52 "JobSet" 45 "LeaderWorkerSet" 47 "PyTorchJob" 51) .Values.workload.kind | default 45 -}}
{{- .Values.fullnameOverride | default .Release.Name | trunc (int $max) | trimSuffix "-" -}}
{{- end -}}

{{- define "coll.name" -}}
{{- .Values.nameOverride | default "coll-agent" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "coll.seedSecret" -}}
{{- printf "%s-seed" (include "coll.fullname" .) -}}
{{- end -}}

{{- define "coll.service" -}}
{{- include "coll.fullname" . -}}
{{- end -}}

{{- define "coll.labels" -}}
app.kubernetes.io/name: {{ include "coll.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "coll.selector" -}}
app.kubernetes.io/name: {{ include "coll.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* The headless service's FQDN, with the trailing dot (no search-list walk). */}}
{{- define "coll.serviceFQDN" -}}
{{- printf "%s.%s.svc.%s." (include "coll.service" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/*
The DNS name of the pod of node index 0, where the others meet: every workload gives
that pod a stable hostname under the headless service (LeaderWorkerSet: its own service,
and the leader's address in LWS_LEADER_ADDRESS, which LWS sets in every container).
*/}}
{{- define "coll.coordinatorHost" -}}
{{- $full := include "coll.fullname" . -}}
{{- $svc := include "coll.serviceFQDN" . -}}
{{- $kind := .Values.workload.kind -}}
{{- if eq $kind "StatefulSet" -}}{{ $full }}-0.{{ $svc }}
{{- else if eq $kind "IndexedJob" -}}{{ $full }}-0.{{ $svc }}
{{- else if eq $kind "JobSet" -}}{{ $full }}-workers-0-0.{{ $svc }}
{{- else if eq $kind "LeaderWorkerSet" -}}${LWS_LEADER_ADDRESS}
{{- else if eq $kind "PyTorchJob" -}}{{ $full }}-coordinator.{{ $svc }}
{{- end -}}
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
  {{- if eq .Values.workload.kind "JobSet" }}
  pods_per_job: {{ .Values.workload.podsPerJob }}
  {{- end }}
  data_port: {{ .Values.agent.ports.data }}
discovery:
  mode: kubernetes
  coordinator: "{{ include "coll.coordinatorHost" . }}:{{ .Values.agent.ports.rendezvous }}"
  service: "{{ include "coll.serviceFQDN" . }}"
http:
  address: 0.0.0.0
  port: {{ .Values.agent.ports.http }}
security:
  data: {{ .Values.security.data | default "none" }}
{{- if .Values.security.curveKeysSecret }}
  keys: /etc/coll/keys
  require_keys: true
{{- else if .Values.security.insecure }}
  insecure: true
{{- else }}
  seed: /etc/coll/seed/seed
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
{{- include "coll.sidecarIn" (ternary . (index (.Subcharts | default dict) "coll-agent") (eq (include "coll.scopeCheck" .) "true")) -}}
{{- end -}}

{{- define "coll.sidecarIn" -}}
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
    {{- with .Values.agent.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
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
  # ready: this pod serves (its group's formation, which waits on peers, left out: a
  # rollout that changes group settings re-forms the group only once it is over)
  readinessProbe:
    httpGet: {path: "/readyz?exclude=formed", port: http}
    periodSeconds: 2
  securityContext:
    runAsNonRoot: true
    runAsUser: {{ .Values.security.runAsUser }}
    runAsGroup: {{ .Values.security.fsGroup }}
    readOnlyRootFilesystem: true
    allowPrivilegeEscalation: false
    capabilities: {drop: [ALL]}
    seccompProfile: {type: RuntimeDefault}
  {{- $res := deepCopy (.Values.agent.resources | default dict) }}
  {{- if eq .Values.gpu.mode "dra" }}
  {{- $_ := set $res "claims" (list (dict "name" "gpu")) }}
  {{- end }}
  {{- with $res }}
  resources: {{ toJson . }}
  {{- end }}
  volumeMounts:
    - {name: coll-socket, mountPath: /run/coll}
    - {name: coll-config, mountPath: /etc/coll/agent.yaml, subPath: agent.yaml, readOnly: true}
    - {name: podinfo, mountPath: /etc/podinfo, readOnly: true}
    - {name: dshm, mountPath: /dev/shm}
    {{- if .Values.security.curveKeysSecret }}
    - {name: coll-keys, mountPath: /etc/coll/keys, readOnly: true}
    {{- else if not .Values.security.insecure }}
    - {name: coll-seed, mountPath: /etc/coll/seed, readOnly: true}
    {{- end }}
    {{- with .Values.agent.volumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{- define "coll.volumes" -}}
{{- include "coll.volumesIn" (ternary . (index (.Subcharts | default dict) "coll-agent") (eq (include "coll.scopeCheck" .) "true")) -}}
{{- end -}}

{{- define "coll.volumesIn" -}}
- name: coll-socket
  emptyDir: {}
- name: dshm
  emptyDir: {medium: Memory, sizeLimit: {{ .Values.workload.shmSizeLimit | quote }}}
- name: coll-config
  configMap: {name: {{ include "coll.fullname" . }}-config}
- name: podinfo
  downwardAPI:
    items:
      - {path: labels, fieldRef: {fieldPath: metadata.labels}}
{{- if .Values.security.curveKeysSecret }}
- name: coll-keys
  secret: {secretName: {{ .Values.security.curveKeysSecret }}, defaultMode: 0440}
{{- else if not .Values.security.insecure }}
- name: coll-seed
  secret: {secretName: {{ include "coll.seedSecret" . }}, defaultMode: 0440}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The application's env: libcoll trusts an agent of another uid only when told. */}}
{{- define "coll.appEnv" -}}
{{- include "coll.appEnvIn" (ternary . (index (.Subcharts | default dict) "coll-agent") (eq (include "coll.scopeCheck" .) "true")) -}}
{{- end -}}

{{- define "coll.appEnvIn" -}}
- {name: COLL_AGENT_UIDS, value: {{ .Values.security.runAsUser | quote }}}
{{- end -}}

{{- define "coll.appMounts" -}}
{{- include "coll.appMountsIn" (ternary . (index (.Subcharts | default dict) "coll-agent") (eq (include "coll.scopeCheck" .) "true")) -}}
{{- end -}}

{{- define "coll.appMountsIn" -}}
- {name: coll-socket, mountPath: /run/coll}
- {name: dshm, mountPath: /dev/shm}
{{- end -}}

{{/* The application's command: a checked allreduce; a Job's pod ends when it is done. */}}
{{- define "coll.appCommand" -}}
{{- if .Values.workload.app.command -}}
{{ toJson .Values.workload.app.command }}
{{- else -}}
{{- $bench := printf "coll-bench -s /run/coll/agent.sock -p 1 -g %s -o allreduce -b 8 -e 1048576 -n 20 -c 1" (index .Values.groups 0).name -}}
{{- if has .Values.workload.kind (list "StatefulSet" "LeaderWorkerSet") -}}
{{ toJson (list "/bin/sh" "-c" (printf "%s && sleep infinity" $bench)) }}
{{- else -}}
{{ toJson (list "/bin/sh" "-c" $bench) }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The pod's metadata and spec for every workload kind: the agent as a native sidecar,
the application, the volumes. Context: (dict "ctx" $ "extra" "<more spec fields>").
*/}}
{{- define "coll.podTemplate" -}}
{{- $ := .ctx -}}
metadata:
  {{- /* the chart's own labels win over podLabels: the selector depends on them */}}
  labels: {{- merge (fromYaml (include "coll.labels" $)) ($.Values.podLabels | default dict) | toYaml | nindent 4 }}
  annotations:
    checksum/config: {{ include "coll.agentConfig" $ | sha256sum }}
    {{- with $.Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  {{- with .extra }}
  {{- . | nindent 2 }}
  {{- end }}
  {{- with $.Values.serviceAccount.name }}
  serviceAccountName: {{ . }}
  {{- end }}
  {{- with $.Values.imagePullSecrets }}
  imagePullSecrets: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $.Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with $.Values.nodeSelector }}
  nodeSelector: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $.Values.tolerations }}
  tolerations: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $.Values.affinity }}
  affinity: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $.Values.topologySpreadConstraints }}
  topologySpreadConstraints: {{- toYaml . | nindent 4 }}
  {{- end }}
  terminationGracePeriodSeconds: {{ $.Values.workload.terminationGracePeriodSeconds }}
  automountServiceAccountToken: false # neither container talks to the API server
  securityContext:
    fsGroup: {{ $.Values.security.fsGroup }}
    runAsNonRoot: true
    seccompProfile: {type: RuntimeDefault}
  {{- if eq $.Values.gpu.mode "dra" }}
  resourceClaims:
    - name: gpu
      resourceClaimTemplateName: {{ include "coll.fullname" $ }}-gpu
  {{- end }}
  initContainers:
{{ include "coll.sidecar" $ | indent 4 }}
  containers:
    - name: {{ eq $.Values.workload.kind "PyTorchJob" | ternary "pytorch" "app" }}
      image: {{ $.Values.workload.app.image | default (printf "%s:%s" $.Values.image.repository $.Values.image.tag) | quote }}
      imagePullPolicy: {{ $.Values.image.pullPolicy }}
      command: {{ include "coll.appCommand" $ }}
      env:
{{ include "coll.appEnv" $ | indent 8 }}
        {{- with $.Values.workload.app.env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      securityContext:
        runAsNonRoot: true
        runAsUser: {{ $.Values.security.appRunAsUser }}
        runAsGroup: {{ $.Values.security.fsGroup }}
        readOnlyRootFilesystem: true
        allowPrivilegeEscalation: false
        capabilities: {drop: [ALL]}
      {{- /* the application's own resources, with the GPUs the mode adds */}}
      {{- $res := deepCopy ($.Values.workload.app.resources | default dict) }}
      {{- if eq $.Values.gpu.mode "devicePlugin" }}
      {{- $lim := $res.limits | default dict }}
      {{- $_ := set $lim "nvidia.com/gpu" $.Values.gpu.count }}
      {{- $_ := set $res "limits" $lim }}
      {{- else if eq $.Values.gpu.mode "dra" }}
      {{- $_ := set $res "claims" (list (dict "name" "gpu")) }}
      {{- end }}
      {{- with $res }}
      resources: {{ toJson . }}
      {{- end }}
      volumeMounts:
{{ include "coll.appMounts" $ | indent 8 }}
        {{- with $.Values.workload.app.volumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
{{ include "coll.volumes" $ | indent 4 }}
{{- end -}}
