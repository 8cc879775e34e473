{{/* vim: set filetype=mustache: */}}

{{/* The components this chart deploys, in order. */}}
{{- define "agentrt.components" -}}
scheduler executor relay
{{- end -}}

{{/* Chart name, overridable with nameOverride. */}}
{{- define "agentrt.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Fully qualified app name, truncated to 63 characters (DNS label limit).
The release name is used alone when it already contains the chart name.
*/}}
{{- define "agentrt.fullname" -}}
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

{{/* Name of one component's objects: (list $ "scheduler"). */}}
{{- define "agentrt.componentname" -}}
{{- $root := index . 0 -}}
{{- $component := index . 1 -}}
{{- printf "%s-%s" (include "agentrt.fullname" $root | trunc (int (sub 62 (len $component)))) $component | trimSuffix "-" -}}
{{- end -}}

{{/* Chart name and version, for the helm.sh/chart label. */}}
{{- define "agentrt.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: (list $ component); component may be "". Immutable once deployed. */}}
{{- define "agentrt.selectorLabels" -}}
{{- $root := index . 0 -}}
{{- $component := index . 1 -}}
app.kubernetes.io/name: {{ include "agentrt.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
{{- if $component }}
app.kubernetes.io/component: {{ $component }}
{{- end }}
{{- end -}}

{{/* Labels of every object: (list $ component); component may be "". */}}
{{- define "agentrt.labels" -}}
{{- $root := index . 0 -}}
helm.sh/chart: {{ include "agentrt.chart" $root }}
{{ include "agentrt.selectorLabels" . }}
app.kubernetes.io/version: {{ $root.Values.image.tag | default $root.Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
app.kubernetes.io/part-of: agentrt
{{- with $root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The container image reference. */}}
{{- define "agentrt.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) -}}
{{- end -}}
{{- end -}}

{{/* Name of the ServiceAccount the components run as. */}}
{{- define "agentrt.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "agentrt.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
One component's values with the shared `defaults` filled in, as JSON:
  $cv := include "agentrt.componentValues" (list $ "executor") | fromJson
A key the component leaves out or sets to null takes the default; a map merges
key by key over the default map (one level down); anything else replaces it.
*/}}
{{- define "agentrt.componentValues" -}}
{{- $root := index . 0 -}}
{{- $component := index . 1 -}}
{{- $out := deepCopy $root.Values.defaults -}}
{{- $own := index $root.Values $component | default dict -}}
{{- range $key, $value := $own -}}
{{- $base := index $out $key -}}
{{- if kindIs "invalid" $value -}}
{{- else if and (kindIs "map" $value) (kindIs "map" $base) -}}
{{- $merged := deepCopy $base -}}
{{- range $k, $v := $value -}}
{{- if not (kindIs "invalid" $v) -}}
{{- $_ := set $merged $k $v -}}
{{- end -}}
{{- end -}}
{{- $_ := set $out $key $merged -}}
{{- else -}}
{{- $_ := set $out $key $value -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The port a component's gRPC health service listens on (its probes' port). */}}
{{- define "agentrt.healthPort" -}}
{{- $root := index . 0 -}}
{{- $component := index . 1 -}}
{{- if eq $component "scheduler" -}}
{{- $root.Values.scheduler.port | int -}}
{{- else -}}
{{- (index $root.Values $component).healthPort | int -}}
{{- end -}}
{{- end -}}

{{/* Name of a component's health/gRPC container port. */}}
{{- define "agentrt.healthPortName" -}}
{{- if eq . "scheduler" }}grpc{{ else }}health{{ end -}}
{{- end -}}

{{/* The scheduler's address as executors dial it. */}}
{{- define "agentrt.schedulerAddress" -}}
{{- if .Values.executor.schedulerAddress -}}
{{- .Values.executor.schedulerAddress -}}
{{- else -}}
{{- printf "%s.%s.svc:%d" (include "agentrt.componentname" (list . "scheduler")) .Release.Namespace (int .Values.scheduler.service.port) -}}
{{- end -}}
{{- end -}}

{{/* The lease duration in milliseconds. */}}
{{- define "agentrt.leaseDurationMs" -}}
{{- $scheduler := .Values.config.scheduler | default dict -}}
{{- $lease := index $scheduler "lease_duration_ms" -}}
{{- if kindIs "invalid" $lease -}}30000{{- else -}}{{- $lease | int64 -}}{{- end -}}
{{- end -}}

{{/*
terminationGracePeriodSeconds for a component: (list $ $cv). Derived from the
lease duration (+15 s) when unset; an explicit value must exceed the lease, so
that a stopping executor's lease expires (and its task is handed on) before
the pod is killed.
*/}}
{{- define "agentrt.terminationGracePeriodSeconds" -}}
{{- $root := index . 0 -}}
{{- $cv := index . 1 -}}
{{- $leaseMs := include "agentrt.leaseDurationMs" $root | int64 -}}
{{- $grace := $cv.terminationGracePeriodSeconds -}}
{{- if kindIs "invalid" $grace -}}
{{- add (div (add $leaseMs 999) 1000) 15 -}}
{{- else -}}
{{- if le (mul ($grace | int64) 1000) $leaseMs -}}
{{- fail (printf "terminationGracePeriodSeconds (%v s) must be longer than the lease duration (config.scheduler.lease_duration_ms = %v ms)" $grace $leaseMs) -}}
{{- end -}}
{{- $grace | int64 -}}
{{- end -}}
{{- end -}}

{{/*
The executors' agents: an existing ConfigMap and/or modules of code-first agents in the image;
without either, the inline definitions (the default). "true" when the inline ones are used.
*/}}
{{- define "agentrt.agentsInline" -}}
{{- $agents := .Values.executor.agents | default dict -}}
{{- if and .Values.executor.enabled (not $agents.existingConfigMap) (not $agents.modules) $agents.definitions -}}
true
{{- end -}}
{{- end -}}

{{/* Where a ConfigMap of agent definitions is mounted in the executor pods. */}}
{{- define "agentrt.agentsMountPath" -}}/etc/agentrt/agents{{- end -}}

{{/* The ConfigMap of agent definitions the executors mount, or "" (only modules, or no executor). */}}
{{- define "agentrt.agentsConfigMap" -}}
{{- if .Values.executor.enabled -}}
{{- if .Values.executor.agents.existingConfigMap -}}
{{- .Values.executor.agents.existingConfigMap -}}
{{- else if include "agentrt.agentsInline" . -}}
{{- include "agentrt.fullname" . }}-agents
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The executors' agents_path: the mounted ConfigMap's directory and the modules, comma-separated;
"" without executors. Fails when the executors would have no agent.
*/}}
{{- define "agentrt.agentsPath" -}}
{{- if .Values.executor.enabled -}}
{{- $parts := list -}}
{{- if include "agentrt.agentsConfigMap" . -}}
{{- $parts = append $parts (include "agentrt.agentsMountPath" .) -}}
{{- end -}}
{{- $parts = concat $parts (.Values.executor.agents.modules | default list) -}}
{{- if not $parts -}}
{{- fail "executor.agents: the executors have no agents; set executor.agents.definitions (definition files inline), executor.agents.existingConfigMap (a ConfigMap of definition files) or executor.agents.modules (Python modules of code-first agents in your image)" -}}
{{- end -}}
{{- join "," $parts -}}
{{- end -}}
{{- end -}}

{{/* The application config file (config.yaml of the ConfigMap). */}}
{{- define "agentrt.configFile" -}}
{{- $config := deepCopy (.Values.config | default dict) -}}
{{- $metricsAddr := printf "0.0.0.0:%d" (int .Values.metrics.port) -}}
{{- $common := mustMergeOverwrite (deepCopy ($config.common | default dict)) (dict "metrics_addr" $metricsAddr) -}}
{{- include "agentrt.refuseSecurityKeys" . -}}
{{- $scheduler := mustMergeOverwrite (deepCopy ($config.scheduler | default dict)) (dict
      "service_name" "agentrt-scheduler"
      "listen_addr" (printf "0.0.0.0:%d" (int .Values.scheduler.port)))
      (include "agentrt.schedulerSecuritySettings" . | fromJson) -}}
{{- $executorDerived := mustMergeOverwrite (dict
      "service_name" "agentrt-executor"
      "scheduler_addr" (include "agentrt.schedulerAddress" .)
      "health_addr" (printf "0.0.0.0:%d" (int .Values.executor.healthPort)))
      (include "agentrt.executorSecuritySettings" . | fromJson) -}}
{{- $agentsPath := include "agentrt.agentsPath" . -}}
{{- if $agentsPath -}}
{{- $_ := set $executorDerived "agents_path" $agentsPath -}}
{{- end -}}
{{- $executor := mustMergeOverwrite (deepCopy ($config.executor | default dict)) $executorDerived -}}
{{- $relayDerived := dict
      "service_name" "agentrt-relay"
      "health_addr" (printf "0.0.0.0:%d" (int .Values.relay.healthPort))
      "kafka_bootstrap" .Values.kafka.bootstrapServers
      "topic" .Values.kafka.topic
      "kafka_security_protocol" .Values.kafka.securityProtocol -}}
{{- if .Values.kafka.sasl.enabled -}}
{{- $_ := set $relayDerived "kafka_sasl_mechanism" .Values.kafka.sasl.mechanism -}}
{{- end -}}
{{- if .Values.kafka.tls.enabled -}}
{{- $_ := set $relayDerived "kafka_ssl_cafile" "/etc/agentrt/kafka-tls/ca.crt" -}}
{{- if and .Values.kafka.tls.certKey .Values.kafka.tls.keyKey -}}
{{- $_ := set $relayDerived "kafka_ssl_certfile" "/etc/agentrt/kafka-tls/tls.crt" -}}
{{- $_ := set $relayDerived "kafka_ssl_keyfile" "/etc/agentrt/kafka-tls/tls.key" -}}
{{- end -}}
{{- end -}}
{{- $relay := mustMergeOverwrite (deepCopy ($config.relay | default dict)) $relayDerived -}}
{{- toYaml (dict "common" $common "scheduler" $scheduler "executor" $executor "relay" $relay) -}}
{{- end -}}

{{/* AGENTRT_DATABASE_URL from the existing database Secret. */}}
{{- define "agentrt.databaseEnv" -}}
- name: AGENTRT_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "database.existingSecret: name the existing Secret that holds the PostgreSQL URL" .Values.database.existingSecret }}
      key: {{ .Values.database.secretKey }}
{{- end -}}

{{/* A service's database URL (list $ component): its own role's Secret with database.roles.enabled,
else the owner's (database.existingSecret). */}}
{{- define "agentrt.serviceDatabaseEnv" -}}
{{- $root := index . 0 -}}
{{- $component := index . 1 -}}
{{- $roles := $root.Values.database.roles -}}
{{- if $roles.enabled -}}
{{- $role := index $roles $component -}}
- name: AGENTRT_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ required (printf "database.roles.%s.existingSecret: name the existing Secret with the %s role's URL and password" $component $component) $role.existingSecret }}
      key: {{ $role.urlKey }}
{{- if eq $component "scheduler" }}
{{- /* Its own role: row-level security binds it, and the scheduler refuses to start otherwise. */}}
- name: AGENTRT_REQUIRE_ROW_SECURITY
  value: "true"
{{- end }}
{{- else -}}
{{- include "agentrt.databaseEnv" $root -}}
{{- end -}}
{{- end -}}

{{/* The migrations' view of the roles: their prefix and each password from its role's Secret. */}}
{{- define "agentrt.rolesEnv" -}}
{{- $roles := .Values.database.roles -}}
- name: AGENTRT_ROLE_PREFIX
  value: {{ $roles.prefix | quote }}
{{- range $service := list "scheduler" "relay" "consumer" "readonly" }}
{{- $role := index $roles $service }}
{{- if $role.existingSecret }}
- name: AGENTRT_{{ upper $service }}_ROLE_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $role.existingSecret }}
      key: {{ $role.passwordKey }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A container running `agentrt migrate`, for the Job or as an init container. */}}
{{- define "agentrt.migrateContainer" -}}
{{- $cv := include "agentrt.componentValues" (list . "migrations") | fromJson -}}
- name: migrate
  image: {{ include "agentrt.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - migrate
    {{- if .Values.database.roles.enabled }}
    - --apply-roles
    {{- end }}
  env:
    {{- include "agentrt.databaseEnv" . | nindent 4 }}
    {{- if .Values.database.roles.enabled }}
    {{- include "agentrt.rolesEnv" . | nindent 4 }}
    {{- end }}
    - name: AGENTRT_LOG_LEVEL
      value: {{ .Values.config.common.log_level | default "INFO" | quote }}
    - name: AGENTRT_LOG_FORMAT
      value: {{ .Values.config.common.log_format | default "text" | quote }}
  resources:
    {{- toYaml $cv.resources | nindent 4 }}
  securityContext:
    {{- toYaml $cv.securityContext | nindent 4 }}
  volumeMounts:
    - name: tmp
      mountPath: /tmp
{{- end -}}
