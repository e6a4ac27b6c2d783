{{/* Names and labels shared by every template. */}}

{{- define "stampguard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "stampguard.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "stampguard.webhook.fullname" -}}{{ include "stampguard.fullname" . }}-webhook{{- end -}}
{{- define "stampguard.sink.fullname" -}}{{ include "stampguard.fullname" . }}-auditsink{{- end -}}

{{- define "stampguard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "stampguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* selectorLabels takes (dict "ctx" $ "component" "webhook"). */}}
{{- define "stampguard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stampguard.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "stampguard.componentLabels" -}}
{{ include "stampguard.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The image: repository@digest when a digest is given, else repository:tag (tag defaults to appVersion). */}}
{{- define "stampguard.image" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
tls returns the material of a chart-generated CA and serving certificate
(caCrt, caKey, crt, key, base64 PEM) and their subject alternative names
(sans). `helm upgrade` keeps what the cluster has: the CA from its Secret
always, the serving certificate while its names are unchanged; with new
names it signs a new one with the same CA, so caBundle never changes.
Takes (dict "ctx" $ "name" SECRET "caName" CA_SECRET "cn" CN "dns" LIST "ips" LIST "days" N).
*/}}
{{- define "stampguard.tls" -}}
{{- $ns := .ctx.Release.Namespace -}}
{{- $sans := concat .dns .ips | join "," -}}
{{- $oldCA := lookup "v1" "Secret" $ns .caName | default dict -}}
{{- $caCrt := dig "data" "tls.crt" "" $oldCA -}}
{{- $caKey := dig "data" "tls.key" "" $oldCA -}}
{{- $ca := dict -}}
{{- if and $caCrt $caKey -}}
{{- $ca = buildCustomCert $caCrt $caKey -}}
{{- else -}}
{{- $ca = genCA (printf "%s-ca" .name) (int .days) -}}
{{- $caCrt = $ca.Cert | b64enc -}}
{{- $caKey = $ca.Key | b64enc -}}
{{- end -}}
{{- $old := lookup "v1" "Secret" $ns .name | default dict -}}
{{- $crt := dig "data" "tls.crt" "" $old -}}
{{- $key := dig "data" "tls.key" "" $old -}}
{{- $same := and $crt $key (eq (dig "data" "ca.crt" "" $old) $caCrt) (eq (dig "metadata" "annotations" "stampguard.dev/subject-alt-names" "" $old) $sans) -}}
{{- if not $same -}}
{{- $cert := genSignedCert .cn .ips .dns (int .days) $ca -}}
{{- $crt = $cert.Cert | b64enc -}}
{{- $key = $cert.Key | b64enc -}}
{{- end -}}
caCrt: {{ $caCrt }}
caKey: {{ $caKey }}
crt: {{ $crt }}
key: {{ $key }}
sans: {{ $sans | quote }}
{{- end -}}

{{/*
tlsSecrets renders the CA Secret and the serving Secret of "stampguard.tls".
Takes (dict "ctx" $ "tls" MATERIAL "name" SECRET "caName" CA_SECRET "component" C).
*/}}
{{- define "stampguard.tlsSecrets" -}}
apiVersion: v1
kind: Secret
metadata:
  name: {{ .caName }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "stampguard.componentLabels" (dict "ctx" .ctx "component" .component) | nindent 4 }}
type: kubernetes.io/tls
data:
  tls.crt: {{ .tls.caCrt }}
  tls.key: {{ .tls.caKey }}
---
apiVersion: v1
kind: Secret
metadata:
  name: {{ .name }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "stampguard.componentLabels" (dict "ctx" .ctx "component" .component) | nindent 4 }}
  annotations:
    stampguard.dev/subject-alt-names: {{ .tls.sans | quote }}
type: kubernetes.io/tls
data:
  ca.crt: {{ .tls.caCrt }}
  tls.crt: {{ .tls.crt }}
  tls.key: {{ .tls.key }}
{{- end -}}

{{/* The DNS names of a Service: (dict "ctx" $ "service" NAME). */}}
{{- define "stampguard.serviceDNSNames" -}}
{{- $ns := .ctx.Release.Namespace -}}
{{- list .service (printf "%s.%s" .service $ns) (printf "%s.%s.svc" .service $ns) (printf "%s.%s.svc.cluster.local" .service $ns) | toJson -}}
{{- end -}}

{{- define "stampguard.issuerRef" -}}
{{- if .Values.certManager.issuerRef -}}
{{ toYaml .Values.certManager.issuerRef }}
{{- else -}}
name: {{ include "stampguard.fullname" . }}-ca
kind: Issuer
group: cert-manager.io
{{- end -}}
{{- end -}}

{{- define "stampguard.sink.cluster" -}}{{ default .Release.Name .Values.auditSink.cluster }}{{- end -}}
{{- define "stampguard.sink.dsnSecret" -}}{{ default (printf "%s-clickhouse" (include "stampguard.sink.fullname" .)) .Values.auditSink.clickhouse.existingSecret }}{{- end -}}
{{- define "stampguard.sink.dsnKey" -}}{{ if .Values.auditSink.clickhouse.existingSecret }}{{ .Values.auditSink.clickhouse.existingSecretKey }}{{ else }}dsn{{ end }}{{- end -}}
{{- define "stampguard.sink.migrateDsnSecret" -}}{{ default (printf "%s-clickhouse-migrate" (include "stampguard.sink.fullname" .)) .Values.auditSink.migrate.existingSecret }}{{- end -}}
{{- define "stampguard.sink.migrateDsnKey" -}}{{ if .Values.auditSink.migrate.existingSecret }}{{ .Values.auditSink.migrate.existingSecretKey }}{{ else }}dsn{{ end }}{{- end -}}
{{- define "stampguard.sink.separateMigrate" -}}{{ if or .Values.auditSink.migrate.dsn .Values.auditSink.migrate.existingSecret }}true{{ end }}{{- end -}}
{{- define "stampguard.sink.tokenSecret" -}}{{ default (printf "%s-token" (include "stampguard.sink.fullname" .)) .Values.auditSink.auth.token.existingSecret }}{{- end -}}
{{- define "stampguard.sink.historySecret" -}}{{ default (printf "%s-history-key" (include "stampguard.sink.fullname" .)) .Values.auditSink.fieldHistory.existingSecret }}{{- end -}}
{{- define "stampguard.sink.historyKey" -}}{{ if .Values.auditSink.fieldHistory.existingSecret }}{{ .Values.auditSink.fieldHistory.existingSecretKey }}{{ else }}key{{ end }}{{- end -}}
{{- define "stampguard.sink.tokenKey" -}}{{ if .Values.auditSink.auth.token.existingSecret }}{{ .Values.auditSink.auth.token.existingSecretKey }}{{ else }}token{{ end }}{{- end -}}

{{/* The sink certificate's IP addresses: the fixed cluster IP and extras. */}}
{{- define "stampguard.sink.ips" -}}
{{- $ips := .Values.auditSink.tls.extraIPAddresses -}}
{{- with .Values.auditSink.service.clusterIP }}{{ if ne . "None" }}{{ $ips = prepend $ips . }}{{ end }}{{ end -}}
{{- with .Values.auditSink.service.loadBalancerIP }}{{ $ips = append $ips . }}{{ end -}}
{{- $ips | uniq | toJson -}}
{{- end -}}

{{/* The guarded resources as the webhook's --sync-resources: group/resource, a bare resource for the core group. */}}
{{- define "stampguard.webhook.syncResources" -}}
{{- $out := list -}}
{{- range .guardedResources -}}
{{- if .group }}{{ $out = append $out (printf "%s/%s" .group .resource) }}{{ else }}{{ $out = append $out .resource }}{{ end -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/* The namespaces never sent to the webhook, as a JSON list: webhook.excludedNamespaces and the release namespace. */}}
{{- define "stampguard.webhook.excludedNamespaces" -}}
{{- $w := .Values.webhook -}}
{{- $excluded := $w.excludedNamespaces | default list -}}
{{- if $w.excludeReleaseNamespace }}{{ $excluded = append $excluded .Release.Namespace }}{{ end -}}
{{- $excluded | uniq | toJson -}}
{{- end -}}

{{/* webhook.namespaceSelector as the webhook's --sync-namespace-selector. */}}
{{- define "stampguard.webhook.syncSelector" -}}
{{- $sel := .namespaceSelector | default dict -}}
{{- $parts := list -}}
{{- range ($sel.matchExpressions | default list) -}}
{{- if eq .operator "In" }}{{ $parts = append $parts (printf "%s in (%s)" .key (join "," .values)) }}
{{- else if eq .operator "NotIn" }}{{ $parts = append $parts (printf "%s notin (%s)" .key (join "," .values)) }}
{{- else if eq .operator "Exists" }}{{ $parts = append $parts .key }}
{{- else }}{{ $parts = append $parts (printf "!%s" .key) }}{{ end -}}
{{- end -}}
{{- range $k, $v := ($sel.matchLabels | default dict) }}{{ $parts = append $parts (printf "%s=%s" $k $v) }}{{ end -}}
{{- join "," $parts -}}
{{- end -}}
