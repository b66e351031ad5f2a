{{/* The prefix of every object's name; config/default's namePrefix without its dash. */}}
{{- define "epo.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Every object's labels: config/default's, then Helm's. */}}
{{- define "epo.labels" -}}
app.kubernetes.io/name: egress-proxies-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The manager's pods; the Deployment's, the Service's and the PDB's selector. */}}
{{- define "epo.selector" -}}
control-plane: controller-manager
{{- end -}}

{{/* The gateway's pods; its Deployment's, Service's, PDB's and HPA's selector. */}}
{{- define "epo.gatewaySelector" -}}
app.kubernetes.io/component: gateway
{{- end -}}
