{{- define "rlscale.fullname" -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rlscale.serviceAccountName" -}}
{{- default (include "rlscale.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "rlscale.labels" -}}
app.kubernetes.io/name: rlscale
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "rlscale.selector" -}}
app.kubernetes.io/name: rlscale
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}
