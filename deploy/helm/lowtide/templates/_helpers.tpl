{{/* Names: RELEASE-lowtide (or the chart's fullnameOverride), then -scheduler, -signal ... */}}
{{- define "lowtide.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "lowtide.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: include with (list $ "scheduler"). */}}
{{- define "lowtide.selector" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ $.Chart.Name }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "lowtide.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "lowtide.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "lowtide.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "lowtide.configSecret" -}}
{{- default (printf "%s-config" (include "lowtide.fullname" .)) .Values.config.existingSecret -}}
{{- end -}}

{{/* The scheduler's and the signal service's in-cluster gRPC addresses. */}}
{{- define "lowtide.schedulerTarget" -}}
{{- printf "%s-scheduler.%s.svc.cluster.local:%v" (include "lowtide.fullname" .) .Release.Namespace .Values.scheduler.port -}}
{{- end -}}
{{- define "lowtide.signalTarget" -}}
{{- printf "%s-signal.%s.svc.cluster.local:%v" (include "lowtide.fullname" .) .Release.Namespace .Values.signal.port -}}
{{- end -}}

{{/* What every lowtide container gets: the configuration file, auth, and TLS as a client. */}}
{{- define "lowtide.commonEnv" -}}
- name: LOWTIDE_CONFIG
  value: /etc/lowtide/config/lowtide.toml
{{- if not .Values.auth.enabled }}
- name: LOWTIDE_AUTH_ENABLED
  value: "false"
- name: LOWTIDE_AUTH_ALLOW_INSECURE_REMOTE
  value: "true"
{{- end }}
{{- if .Values.tls.enabled }}
- name: LOWTIDE_CA
  value: /etc/lowtide/tls/ca.crt
{{- if .Values.tls.mutual }}
- name: LOWTIDE_CERT
  value: /etc/lowtide/tls/tls.crt
- name: LOWTIDE_KEY
  value: /etc/lowtide/tls/tls.key
{{- end }}
{{- end }}
{{- end -}}

{{/* A serving service's TLS: its certificate, and the client CA under mutual TLS. Include with
(list $ demandClientCertificates). */}}
{{- define "lowtide.serverTlsEnv" -}}
{{- $ := index . 0 -}}
{{- if $.Values.tls.enabled }}
- name: LOWTIDE_TLS_CERT
  value: /etc/lowtide/tls/tls.crt
- name: LOWTIDE_TLS_KEY
  value: /etc/lowtide/tls/tls.key
{{- if and $.Values.tls.mutual (index . 1) }}
- name: LOWTIDE_TLS_CLIENT_CA
  value: /etc/lowtide/tls/ca.crt
{{- end }}
{{- end }}
{{- end -}}

{{- define "lowtide.databaseEnv" -}}
- name: LOWTIDE_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "database.existingSecret: name the Secret holding your PostgreSQL URL" .Values.database.existingSecret }}
      key: {{ .Values.database.key }}
{{- end -}}

{{- define "lowtide.volumes" -}}
- name: config
  secret:
    secretName: {{ include "lowtide.configSecret" . }}
- name: tmp
  emptyDir: {}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ required "tls.secretName: name the kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt)" .Values.tls.secretName }}
{{- end }}
{{- end -}}

{{- define "lowtide.volumeMounts" -}}
- name: config
  mountPath: /etc/lowtide/config
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/lowtide/tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* gRPC health as a probe: Kubernetes' own gRPC probe on plaintext; under TLS (which it cannot
speak) `lowtide health` through the certificate, against localhost. Include with
(list $ port service). */}}
{{- define "lowtide.grpcProbe" -}}
{{- $ := index . 0 -}}
{{- if $.Values.tls.enabled }}
exec:
  command: ["lowtide", "health", "--target", "localhost:{{ index . 1 }}"{{ with index . 2 }}, "--service", {{ . | quote }}{{ end }}]
{{- else }}
grpc:
  port: {{ index . 1 }}
  {{- with index . 2 }}
  service: {{ . | quote }}
  {{- end }}
{{- end }}
{{- end -}}

{{- define "lowtide.podSecurity" -}}
serviceAccountName: {{ include "lowtide.serviceAccountName" . }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
