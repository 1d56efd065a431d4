{{/* Names and labels. */}}
{{- define "eai.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "eai.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "eai.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "eai.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: eai-tool-gateway
{{- end -}}

{{/* Selector labels of one component (api, worker, beat, postgresql, redis, migrations). */}}
{{- define "eai.selector" -}}
app.kubernetes.io/name: {{ include "eai.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "eai.image" -}}
{{- printf "%s:%s" .Values.controlPlane.image.repository (default .Chart.AppVersion .Values.controlPlane.image.tag) -}}
{{- end -}}

{{- define "eai.serviceAccountName" -}}
{{- if .Values.controlPlane.serviceAccount.create -}}
{{- default (include "eai.fullname" .) .Values.controlPlane.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.controlPlane.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Whether a broker exists: bundled Redis, or one named in the config. */}}
{{- define "eai.hasBroker" -}}
{{- if or .Values.redis.enabled .Values.controlPlane.config.EAI_REDIS_URL .Values.controlPlane.config.EAI_BROKER_URL .Values.controlPlane.secrets.EAI_REDIS_URL .Values.controlPlane.secrets.EAI_BROKER_URL -}}true{{- end -}}
{{- end -}}

{{- define "eai.generatedSecretName" -}}{{ include "eai.fullname" . }}-generated{{- end -}}
{{- define "eai.secretName" -}}{{ default (printf "%s-env" (include "eai.fullname" .)) .Values.controlPlane.existingSecret }}{{- end -}}
{{- define "eai.postgresqlHost" -}}{{ include "eai.fullname" . }}-postgresql{{- end -}}
{{- define "eai.redisHost" -}}{{ include "eai.fullname" . }}-redis{{- end -}}

{{/* The non-secret environment every gateway container gets (also in the hook copy). */}}
{{- define "eai.configData" -}}
EAI_ALLOWED_HOSTS: {{ include "eai.allowedHosts" . | quote }}
{{- $defaults := dict "EAI_AUDIT_ANCHOR_PATH" "/var/lib/eai/anchors/anchors.jsonl" "PROMETHEUS_MULTIPROC_DIR" "/var/run/eai-metrics" "EAI_SANDBOX_RUNTIME" "off" }}
{{- /* Sandboxed tools need user namespaces, which pods rarely get: off unless configured. */}}
{{- range $key, $value := $defaults }}
{{- if not (hasKey $.Values.controlPlane.config $key) }}
{{ $key }}: {{ $value | quote }}
{{- end }}
{{- end }}
{{- if and .Values.redis.enabled (not (hasKey .Values.controlPlane.config "EAI_REDIS_URL")) }}
EAI_REDIS_URL: {{ printf "redis://%s:6379/0" (include "eai.redisHost" .) | quote }}
EAI_CACHE_URL: {{ printf "redis://%s:6379/1" (include "eai.redisHost" .) | quote }}
{{- end }}
{{- range $key, $value := .Values.controlPlane.config }}
{{- if ne $key "EAI_ALLOWED_HOSTS" }}
{{ $key }}: {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "eai.allowedHosts" -}}
{{- $hosts := list "localhost" "127.0.0.1" (include "eai.fullname" .) (printf "%s.%s.svc" (include "eai.fullname" .) .Release.Namespace) (printf "%s.%s.svc.cluster.local" (include "eai.fullname" .) .Release.Namespace) -}}
{{- with .Values.controlPlane.ingress.host }}{{ $hosts = append $hosts . }}{{ end -}}
{{- with .Values.controlPlane.config.EAI_ALLOWED_HOSTS }}{{ $hosts = concat (splitList "," .) $hosts }}{{ end -}}
{{- join "," (uniq $hosts) -}}
{{- end -}}

{{/* The secret environment from values (also in the hook copy). */}}
{{- define "eai.secretData" -}}
{{- range $key, $value := .Values.controlPlane.secrets }}
{{ $key }}: {{ $value | toString | b64enc | quote }}
{{- end }}
{{- if not .Values.postgresql.enabled }}
{{- with .Values.externalDatabase.url }}
EAI_DATABASE_URL: {{ . | b64enc | quote }}
{{- end }}
{{- with .Values.externalDatabase.migrateUrl }}
EAI_MIGRATE_DATABASE_URL: {{ . | b64enc | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Environment of gateway containers: generated secrets, then config, then the user's
     secret (later sources win), then the bundled database's URLs built from the
     generated passwords. `migrate` adds the owner's and the superuser's URLs. */}}
{{- define "eai.envFrom" -}}
- secretRef:
    name: {{ include "eai.generatedSecretName" .root }}
- configMapRef:
    name: {{ include "eai.fullname" .root }}{{ .suffix }}
- secretRef:
    name: {{ if .root.Values.controlPlane.existingSecret }}{{ .root.Values.controlPlane.existingSecret }}{{ else }}{{ include "eai.fullname" .root }}-env{{ .suffix }}{{ end }}
{{- end -}}

{{- define "eai.dbEnv" -}}
{{- if .root.Values.postgresql.enabled }}
- name: EAI_DB_APP_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ include "eai.generatedSecretName" .root }}, key: EAI_DB_APP_PASSWORD}}
- name: EAI_DATABASE_URL
  value: {{ printf "postgres://eai_app:$(EAI_DB_APP_PASSWORD)@%s:5432/%s" (include "eai.postgresqlHost" .root) .root.Values.postgresql.database | quote }}
- name: EAI_DB_APP_ROLE
  value: eai_app
{{- if .migrate }}
- name: EAI_DB_OWNER_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ include "eai.generatedSecretName" .root }}, key: EAI_DB_OWNER_PASSWORD}}
- name: EAI_DB_SUPERUSER_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ include "eai.generatedSecretName" .root }}, key: POSTGRES_PASSWORD}}
- name: EAI_MIGRATE_DATABASE_URL
  value: {{ printf "postgres://eai_owner:$(EAI_DB_OWNER_PASSWORD)@%s:5432/%s" (include "eai.postgresqlHost" .root) .root.Values.postgresql.database | quote }}
- name: EAI_DB_ADMIN_URL
  value: {{ printf "postgres://postgres:$(EAI_DB_SUPERUSER_PASSWORD)@%s:5432/postgres" (include "eai.postgresqlHost" .root) | quote }}
- name: EAI_DB_NAME
  value: {{ .root.Values.postgresql.database | quote }}
- name: EAI_DB_OWNER_ROLE
  value: eai_owner
{{- end }}
{{- end }}
{{- end -}}

{{- define "eai.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "eai.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Writable places under the read-only root filesystem. */}}
{{- define "eai.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: metrics
  mountPath: /var/run/eai-metrics
{{- if .anchors }}
- name: anchors
  mountPath: /var/lib/eai/anchors
{{- end }}
{{- end -}}

{{- define "eai.volumes" -}}
- name: tmp
  emptyDir: {medium: Memory, sizeLimit: 64Mi}
- name: metrics
  emptyDir: {sizeLimit: 64Mi}
{{- if .anchors }}
- name: anchors
{{- if .root.Values.controlPlane.auditAnchors.persistence.enabled }}
  persistentVolumeClaim:
    claimName: {{ default (printf "%s-anchors" (include "eai.fullname" .root)) .root.Values.controlPlane.auditAnchors.persistence.existingClaim }}
{{- else }}
  emptyDir: {}
{{- end }}
{{- end }}
{{- end -}}

{{- define "eai.scheduling" -}}
{{- with .Values.controlPlane.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.controlPlane.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.controlPlane.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.controlPlane.topologySpreadConstraints }}
topologySpreadConstraints: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.controlPlane.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Probes send Host: localhost (ALLOWED_HOSTS is exact) and X-Forwarded-Proto: https
     (no redirect when EAI_HTTPS=1). */}}
{{- define "eai.probeHeaders" -}}
httpHeaders:
  - {name: Host, value: localhost}
  - {name: X-Forwarded-Proto, value: https}
{{- end -}}
