{{- /* app.kubernetes.io/name: "rlscale", or nameOverride. */ -}}
{{- define "rlscale.name" -}}
{{- default "rlscale" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /* <release>-operator (the Lease, the Service and the roles are named after it), <release>-<nameOverride>,
or fullnameOverride as it is. */ -}}
{{- define "rlscale.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (default "operator" .Values.nameOverride) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "rlscale.serviceAccountName" -}}
{{- default (include "rlscale.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "rlscale.labels" -}}
app.kubernetes.io/name: {{ include "rlscale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "rlscale.selector" -}}
app.kubernetes.io/name: {{ include "rlscale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- /* A Prometheus duration (30m, 1h30m, 90s) in seconds, for a comparison with time(). */ -}}
{{- define "rlscale.seconds" -}}
{{- $total := 0 -}}
{{- range (regexFindAll "[0-9]+[a-z]+" . -1) -}}
{{- $n := int (regexFind "^[0-9]+" .) -}}
{{- $u := regexFind "[a-z]+$" . -}}
{{- $total = add $total (mul $n (get (dict "s" 1 "m" 60 "h" 3600 "d" 86400 "w" 604800) $u | default 0)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}
