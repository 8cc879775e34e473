{{/* vim: set filetype=mustache: */}}
{{- /*
TLS on the scheduler's gRPC port and authentication of its callers (values `tls` and `auth`).

Where the material is mounted. Every one is a whole Secret / ConfigMap volume (or a
projection of some of its keys with `items`), never a subPath mount: the kubelet updates
such volumes in place when the Secret changes (a renewed cert-manager certificate, a
rotated Secret), and the scheduler reads its certificate and key again when the files
change on disk. A subPath mount would keep the old files until the pod restarts.
*/ -}}
{{- define "agentrt.tlsDir" -}}/etc/agentrt/tls{{- end -}}
{{- define "agentrt.clientCaDir" -}}/etc/agentrt/client-ca{{- end -}}
{{- define "agentrt.schedulerCaDir" -}}/etc/agentrt/scheduler-ca{{- end -}}
{{- define "agentrt.clientTlsDir" -}}/etc/agentrt/client-tls{{- end -}}
{{- define "agentrt.jwksDir" -}}/etc/agentrt/jwks{{- end -}}

{{/* Refuses TLS values that contradict each other (called by agentrt.configFile). */}}
{{- define "agentrt.tls.validate" -}}
{{- $tls := .Values.tls -}}
{{- if and $tls.mutual.enabled (not $tls.enabled) -}}
{{- fail "tls.mutual.enabled: mutual TLS needs tls.enabled=true" -}}
{{- end -}}
{{- if and $tls.enabled $tls.certManager.enabled -}}
{{- if $tls.existingSecret -}}
{{- fail "tls.existingSecret and tls.certManager.enabled: set one (cert-manager writes the Secret tls.certManager.secretName)" -}}
{{- end -}}
{{- if not $tls.certManager.issuerRef.name -}}
{{- fail "tls.certManager.issuerRef.name: name the cert-manager Issuer (or ClusterIssuer, with issuerRef.kind) that signs the scheduler's certificate" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The Secret (kubernetes.io/tls: tls.crt, tls.key, ca.crt) of the scheduler's certificate; "" without TLS. */}}
{{- define "agentrt.tls.schedulerSecret" -}}
{{- if .Values.tls.enabled -}}
{{- $default := include "agentrt.componentname" (list . "scheduler-tls") -}}
{{- if .Values.tls.certManager.enabled -}}
{{- .Values.tls.certManager.secretName | default $default -}}
{{- else -}}
{{- .Values.tls.existingSecret | default $default -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The Secret and key of the CA the executors verify the scheduler's certificate with. */}}
{{- define "agentrt.tls.caSecret" -}}
{{- .Values.tls.caSecret | default (include "agentrt.tls.schedulerSecret" .) -}}
{{- end -}}
{{- define "agentrt.tls.caKey" -}}
{{- if .Values.tls.caSecret }}{{ .Values.tls.caKey | default "ca.crt" }}{{ else }}ca.crt{{ end -}}
{{- end -}}

{{/* "true" when the chart renders the executors' client Certificate (mutual TLS with cert-manager). */}}
{{- define "agentrt.tls.executorCertificate" -}}
{{- $tls := .Values.tls -}}
{{- if and $tls.enabled $tls.mutual.enabled $tls.certManager.enabled (not $tls.mutual.executorSecret) .Values.executor.enabled -}}
true
{{- end -}}
{{- end -}}

{{/* The Secret (tls.crt, tls.key) of the executors' client certificate; "" without mutual TLS. */}}
{{- define "agentrt.tls.executorSecret" -}}
{{- $tls := .Values.tls -}}
{{- if and $tls.enabled $tls.mutual.enabled .Values.executor.enabled -}}
{{- if $tls.mutual.executorSecret -}}
{{- $tls.mutual.executorSecret -}}
{{- else if $tls.certManager.enabled -}}
{{- include "agentrt.componentname" (list . "executor-tls") -}}
{{- else -}}
{{- fail "tls.mutual.executorSecret: with mutual TLS the executors need a client certificate; name an existing kubernetes.io/tls Secret, or enable tls.certManager to have one issued" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The scheduler's client CA file under mutual TLS: a Secret of its own, else the ca.crt of its certificate's Secret. */}}
{{- define "agentrt.tls.clientCaFile" -}}
{{- if .Values.tls.mutual.clientCaSecret -}}
{{- include "agentrt.clientCaDir" . }}/ca.crt
{{- else -}}
{{- include "agentrt.tlsDir" . }}/ca.crt
{{- end -}}
{{- end -}}

{{/* "true" when auth.mode includes jwt. */}}
{{- define "agentrt.auth.jwt" -}}
{{- if has "jwt" (splitList "," (.Values.auth.mode | replace " " "")) -}}
true
{{- end -}}
{{- end -}}

{{/* The ConfigMap of the JWKS the scheduler mounts, or "". */}}
{{- define "agentrt.auth.jwksConfigMap" -}}
{{- if include "agentrt.auth.jwt" . -}}
{{- .Values.auth.jwt.jwksConfigMap -}}
{{- end -}}
{{- end -}}

{{/* The TCP port of auth.jwt.jwksUrl (the scheduler fetches the keys from it), or "". */}}
{{- define "agentrt.auth.jwksPort" -}}
{{- if and (include "agentrt.auth.jwt" .) .Values.auth.jwt.jwksUrl -}}
{{- $url := urlParse .Values.auth.jwt.jwksUrl -}}
{{- $hostPort := splitList ":" $url.host -}}
{{- if gt (len $hostPort) 1 -}}
{{- last $hostPort | int -}}
{{- else if eq $url.scheme "http" -}}
80
{{- else -}}
443
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Settings the chart derives from `tls` and `auth`: a user may not set them under `config`
as well (the values would silently win over each other).
*/}}
{{- define "agentrt.refuseSecurityKeys" -}}
{{- $config := .Values.config | default dict -}}
{{- $derived := dict
      "scheduler" (dict
        "auth_mode" "auth.mode"
        "api_key_cache_ttl_ms" "auth.apiKeyCacheTtlMs"
        "jwt_issuer" "auth.jwt.issuer"
        "jwt_audience" "auth.jwt.audience"
        "jwt_jwks_url" "auth.jwt.jwksUrl"
        "jwt_jwks_file" "auth.jwt.jwksConfigMap"
        "jwt_algorithms" "auth.jwt.algorithms"
        "jwt_tenant_claim" "auth.jwt.tenantClaim"
        "jwt_roles_claim" "auth.jwt.rolesClaim"
        "tls_cert_file" "tls.existingSecret or tls.certManager"
        "tls_key_file" "tls.existingSecret or tls.certManager"
        "tls_client_ca_file" "tls.mutual"
        "work_client_identities" "tls.mutual.executorIdentity")
      "executor" (dict
        "scheduler_tls_ca_file" "tls.caSecret"
        "scheduler_tls_cert_file" "tls.mutual.executorSecret"
        "scheduler_tls_key_file" "tls.mutual.executorSecret"
        "scheduler_tls_server_name" "tls.serverName"
        "scheduler_insecure" "tls.enabled") -}}
{{- range $section, $keys := $derived -}}
{{- $own := index $config $section | default dict -}}
{{- range $key, $value := $keys -}}
{{- if hasKey $own $key -}}
{{- fail (printf "config.%s.%s: the chart sets it from %s; set that value instead" $section $key $value) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The scheduler's TLS and auth settings (config file keys), as JSON. */}}
{{- define "agentrt.schedulerSecuritySettings" -}}
{{- include "agentrt.tls.validate" . -}}
{{- $auth := .Values.auth -}}
{{- $out := dict "auth_mode" ($auth.mode | replace " " "") -}}
{{- if not (kindIs "invalid" $auth.apiKeyCacheTtlMs) -}}
{{- $_ := set $out "api_key_cache_ttl_ms" ($auth.apiKeyCacheTtlMs | int) -}}
{{- end -}}
{{- if include "agentrt.auth.jwt" . -}}
{{- $jwt := $auth.jwt -}}
{{- if not (and $jwt.issuer $jwt.audience) -}}
{{- fail (printf "auth.mode %s: set auth.jwt.issuer and auth.jwt.audience (the iss and aud every token must carry)" $auth.mode) -}}
{{- end -}}
{{- if eq (empty $jwt.jwksUrl) (empty $jwt.jwksConfigMap) -}}
{{- fail (printf "auth.mode %s: set one of auth.jwt.jwksUrl (the issuer's JWKS endpoint) and auth.jwt.jwksConfigMap (a ConfigMap holding the JWKS)" $auth.mode) -}}
{{- end -}}
{{- $_ := set $out "jwt_issuer" $jwt.issuer -}}
{{- $_ := set $out "jwt_audience" $jwt.audience -}}
{{- if $jwt.jwksUrl -}}
{{- $_ := set $out "jwt_jwks_url" $jwt.jwksUrl -}}
{{- else -}}
{{- $_ := set $out "jwt_jwks_file" (printf "%s/%s" (include "agentrt.jwksDir" .) ($jwt.jwksConfigMapKey | default "jwks.json")) -}}
{{- end -}}
{{- with $jwt.algorithms -}}
{{- $_ := set $out "jwt_algorithms" . -}}
{{- end -}}
{{- with $jwt.tenantClaim -}}
{{- $_ := set $out "jwt_tenant_claim" . -}}
{{- end -}}
{{- with $jwt.rolesClaim -}}
{{- $_ := set $out "jwt_roles_claim" . -}}
{{- end -}}
{{- end -}}
{{- if .Values.tls.enabled -}}
{{- $_ := set $out "tls_cert_file" (printf "%s/tls.crt" (include "agentrt.tlsDir" .)) -}}
{{- $_ := set $out "tls_key_file" (printf "%s/tls.key" (include "agentrt.tlsDir" .)) -}}
{{- if .Values.tls.mutual.enabled -}}
{{- $_ := set $out "tls_client_ca_file" (include "agentrt.tls.clientCaFile" .) -}}
{{- $_ := set $out "work_client_identities" (list .Values.tls.mutual.executorIdentity) -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
The executors' settings for reaching the scheduler, as JSON: its CA (and, for mutual TLS,
their client certificate) with TLS; plaintext only when tls.enabled is false, and then
said explicitly (scheduler_insecure), since the executor token travels in clear.
*/}}
{{- define "agentrt.executorSecuritySettings" -}}
{{- include "agentrt.tls.validate" . -}}
{{- $out := dict -}}
{{- if .Values.tls.enabled -}}
{{- $_ := set $out "scheduler_tls_ca_file" (printf "%s/ca.crt" (include "agentrt.schedulerCaDir" .)) -}}
{{- with .Values.tls.serverName -}}
{{- $_ := set $out "scheduler_tls_server_name" . -}}
{{- end -}}
{{- if .Values.tls.mutual.enabled -}}
{{- $_ := set $out "scheduler_tls_cert_file" (printf "%s/tls.crt" (include "agentrt.clientTlsDir" .)) -}}
{{- $_ := set $out "scheduler_tls_key_file" (printf "%s/tls.key" (include "agentrt.clientTlsDir" .)) -}}
{{- end -}}
{{- else -}}
{{- $_ := set $out "scheduler_insecure" true -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
The probes' handler for a component: (list $ component).

Kubernetes' native gRPC probe speaks plaintext only: against the scheduler's TLS port
its handshake fails and the pod never becomes ready. The scheduler serves health on its
gRPC port only (there is no plaintext health port), so with TLS its probes are tcpSocket
probes on that port: they need no certificate (under mutual TLS a probe could not present
one) and they mean what the gRPC health check meant at start, because the scheduler binds
the port only once it has connected to PostgreSQL, checked the schema and built its auth,
and a process that exits closes it. (An exec probe would fork a Python gRPC client every
few seconds and, under mutual TLS, need a client certificate in the scheduler's pod.)
A stopping pod leaves the Service's endpoints as soon as it terminates, whatever the probe.
Without TLS, and for the executors' and relay's plaintext health ports, native gRPC probes.
*/}}
{{- define "agentrt.probeHandler" -}}
{{- $root := index . 0 -}}
{{- $component := index . 1 -}}
{{- $readiness := and (gt (len .) 2) (eq (index . 2) "readiness") -}}
{{- $port := include "agentrt.healthPort" (list $root $component) | int -}}
{{- if and (eq $component "scheduler") $root.Values.tls.enabled -}}
tcpSocket:
  port: {{ $port }}
{{- else -}}
grpc:
  port: {{ $port }}
{{- /* The scheduler's readiness follows the database: RunService answers NOT_SERVING while no
     primary takes writes (a failover; docs/ha.md). Liveness ("") stays SERVING: no restart. */}}
{{- if and $readiness (eq $component "scheduler") $root.Values.database.readinessFollowsPrimary }}
  service: agentrt.v1.RunService
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The executor token's Secret: the one named in workToken.existingSecret; with authentication
     on and no mutual TLS, "<fullname>-executor-token" (it must exist), because the scheduler
     refuses to leave WorkService (every tenant's runs) open while RunService authenticates. */}}
{{- define "agentrt.workTokenSecret" -}}
{{- if .Values.workToken.existingSecret -}}
{{ .Values.workToken.existingSecret }}
{{- else if and (ne .Values.auth.mode "none") (not (and .Values.tls.enabled .Values.tls.mutual.enabled)) -}}
{{ include "agentrt.fullname" . }}-executor-token
{{- end -}}
{{- end -}}
