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

{{- define "stampguard.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{/* The restricted pod and container security contexts. */}}
{{- define "stampguard.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "stampguard.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
tlsSecretData returns the data of a kubernetes.io/tls Secret (ca.crt,
tls.crt, tls.key): the existing Secret's when it has all three, so that
`helm upgrade` keeps the CA and certificate, else a new CA and a certificate
it signs. Takes (dict "ctx" $ "name" SECRET "cn" CN "dns" LIST "ips" LIST "days" N).
*/}}
{{- define "stampguard.tlsSecretData" -}}
{{- $old := lookup "v1" "Secret" .ctx.Release.Namespace .name -}}
{{- if and $old $old.data (index $old.data "ca.crt") (index $old.data "tls.crt") (index $old.data "tls.key") -}}
ca.crt: {{ index $old.data "ca.crt" }}
tls.crt: {{ index $old.data "tls.crt" }}
tls.key: {{ index $old.data "tls.key" }}
{{- else -}}
{{- $ca := genCA (printf "%s-ca" .name) (int .days) -}}
{{- $cert := genSignedCert .cn .ips .dns (int .days) $ca -}}
ca.crt: {{ $ca.Cert | b64enc }}
tls.crt: {{ $cert.Cert | b64enc }}
tls.key: {{ $cert.Key | b64enc }}
{{- end -}}
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
{{- define "stampguard.sink.tokenSecret" -}}{{ default (printf "%s-token" (include "stampguard.sink.fullname" .)) .Values.auditSink.auth.token.existingSecret }}{{- end -}}
{{- define "stampguard.sink.tokenKey" -}}{{ if .Values.auditSink.auth.token.existingSecret }}{{ .Values.auditSink.auth.token.existingSecretKey }}{{ else }}token{{ end }}{{- end -}}

{{/*
webhook.rules: one rule per API group in order of first appearance, as
admission.ConfigOptions.rules builds them; with scale, deployments,
statefulsets and replicasets get their scale subresource too. Takes
(dict "resources" LIST "scale" BOOL "ops" LIST).
*/}}
{{- define "stampguard.webhook.rules" -}}
{{- $groups := list -}}
{{- $byGroup := dict -}}
{{- range .resources -}}
{{- $g := .group | default "" -}}
{{- if not (hasKey $byGroup $g) }}{{ $groups = append $groups $g }}{{ $_ := set $byGroup $g list }}{{ end -}}
{{- $rs := append (get $byGroup $g) .resource -}}
{{- if and $.scale (eq $g "apps") (has .resource (list "deployments" "statefulsets" "replicasets")) }}{{ $rs = append $rs (printf "%s/scale" .resource) }}{{ end -}}
{{- $_ := set $byGroup $g $rs -}}
{{- end -}}
{{- range $groups }}
- operations: {{ toJson $.ops }}
  apiGroups: [{{ . | quote }}]
  apiVersions: ["*"]
  resources: {{ toJson (get $byGroup .) }}
  scope: "*"
{{- end -}}
{{- end -}}

{{/* The sink certificate's IP addresses: the fixed cluster IP and extras. */}}
{{- define "stampguard.sink.ips" -}}
{{- $ips := .Values.auditSink.tls.extraIPAddresses -}}
{{- with .Values.auditSink.service.clusterIP }}{{ if ne . "None" }}{{ $ips = prepend $ips . }}{{ end }}{{ end -}}
{{- with .Values.auditSink.service.loadBalancerIP }}{{ $ips = append $ips . }}{{ end -}}
{{- $ips | uniq | toJson -}}
{{- end -}}
