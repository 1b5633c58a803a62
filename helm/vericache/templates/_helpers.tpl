{{/*
Shared names, labels and pod fragments of the vericache chart.
*/}}

{{- define "vericache.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-scoped base name; object names are "<fullname>-<component>[...]". */}}
{{- define "vericache.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A DNS label (Service and pod-hostname rules): names are never truncated,
because two workers cut to the same name would share a Service. Too long
fails the render with the name in the message.
Usage: include "vericache.dnsLabel" "some-name"
*/}}
{{- define "vericache.dnsLabel" -}}
{{- if gt (len .) 63 }}
{{- fail (printf "name %q is longer than 63 characters; shorten the release name, fullnameOverride or the pool name" .) }}
{{- end }}
{{- . }}
{{- end }}

{{- define "vericache.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "vericache.labels" -}}
helm.sh/chart: {{ include "vericache.chart" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vericache
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/*
Selector labels of one component. Usage:
  include "vericache.selectorLabels" (dict "root" $ "component" "kvstore")
*/}}
{{- define "vericache.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vericache.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Image reference of one daemon. Usage: include "vericache.image" (dict "root" $ "repo" .Values.image.kvstore) */}}
{{- define "vericache.image" -}}
{{- $tag := default .root.Chart.AppVersion .root.Values.image.tag }}
{{- printf "%s%s:%s" .root.Values.image.registry .repo $tag }}
{{- end }}

{{- define "vericache.kvstoreName" -}}
{{- include "vericache.dnsLabel" (printf "%s-kvstore" (include "vericache.fullname" .)) }}
{{- end }}

{{/* The store's gRPC address as the workers and the coordinator dial it. */}}
{{- define "vericache.kvstoreAddress" -}}
{{- printf "%s:%d" (include "vericache.kvstoreName" .) (int .Values.kvstore.port) }}
{{- end }}

{{- define "vericache.configName" -}}
{{- printf "%s-config" (include "vericache.fullname" .) }}
{{- end }}

{{/*
One worker's name (Deployment and Service): <fullname>-<role>-<pool>-<index>.
Usage: include "vericache.workerName" (dict "root" $ "role" "verifier" "pool" "local" "index" 0)
*/}}
{{- define "vericache.workerName" -}}
{{- include "vericache.dnsLabel" (printf "%s-%s-%s-%d" (include "vericache.fullname" .root) .role .pool (int .index)) }}
{{- end }}

{{/*
Comma-separated HOST:PORT of every worker of a role, across its pools: the
coordinator's --verifiers / --drafters.
Usage: include "vericache.workerList" (dict "root" $ "role" "verifier")
*/}}
{{- define "vericache.workerList" -}}
{{- $root := .root }}
{{- $role := .role }}
{{- $cfg := index $root.Values $role }}
{{- $addrs := list }}
{{- range $pool := $cfg.pools }}
{{- range $i := until (int (default 0 $pool.replicas)) }}
{{- $addrs = append $addrs (printf "%s:%d" (include "vericache.workerName" (dict "root" $root "role" $role "pool" $pool.name "index" $i)) (int $cfg.port)) }}
{{- end }}
{{- end }}
{{- join "," $addrs }}
{{- end }}

{{/* The pod's own IP, for flags that must name a routable address. */}}
{{- define "vericache.podIPEnv" -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end }}

{{/* Annotations that let annotation-based Prometheus discovery find a pod. */}}
{{- define "vericache.metricsAnnotations" -}}
{{- if and .Values.metrics.enabled .Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metrics.port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{/* --metrics-listen for every daemon: off (empty) when metrics are disabled. */}}
{{- define "vericache.metricsFlag" -}}
{{- if .Values.metrics.enabled }}
- --metrics-listen=0.0.0.0:{{ .Values.metrics.port }}
{{- else }}
- --metrics-listen=
{{- end }}
{{- end }}

{{/* Container port list entry for metrics. */}}
{{- define "vericache.metricsPort" -}}
{{- if .Values.metrics.enabled }}
- name: metrics
  containerPort: {{ .Values.metrics.port }}
  protocol: TCP
{{- end }}
{{- end }}

{{/*
gRPC probes against grpc.health.v1 on the daemon's gRPC port (Kubernetes
native grpc probes, GA since 1.27). The startup probe gives slow starters
(model loading, RocksDB recovery) startupSeconds before liveness counts.
Usage: include "vericache.grpcProbes" (dict "port" 7400 "startupSeconds" 120)
*/}}
{{- define "vericache.grpcProbes" -}}
startupProbe:
  grpc:
    port: {{ .port }}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: {{ max 1 (div (int .startupSeconds) 5) }}
readinessProbe:
  grpc:
    port: {{ .port }}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
livenessProbe:
  grpc:
    port: {{ .port }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
{{- end }}

{{/* Memory-backed /dev/shm for UCX's shared-memory transports. */}}
{{- define "vericache.shmVolume" -}}
{{- if eq .Values.dataPlane "ucx" }}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: 1Gi
{{- end }}
{{- end }}

{{- define "vericache.shmMount" -}}
{{- if eq .Values.dataPlane "ucx" }}
- name: dshm
  mountPath: /dev/shm
{{- end }}
{{- end }}

{{/* Checksum of the ConfigMap: pods roll when a setting in it changes. */}}
{{- define "vericache.configChecksum" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- end }}

{{/*
Trust (docs/security.md). The TLS Secret every daemon mounts: tls.crt,
tls.key and ca.crt (the layout of kubernetes.io/tls Secrets that cert-manager
writes). tls.secretName, or "<fullname>-tls" (what the cert-manager
Certificate of this chart writes, or what you create).
*/}}
{{- define "vericache.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "vericache.fullname" .)) .Values.tls.secretName }}
{{- end }}

{{/* The KV secret Secret (key kvEncryption.secretKey). */}}
{{- define "vericache.kvSecretName" -}}
{{- default (printf "%s-kv-secret" (include "vericache.fullname" .)) .Values.kvEncryption.secretName }}
{{- end }}

{{/* The API keys Secret (keys auth.apiKeysKey and auth.clusterSecretKey). */}}
{{- define "vericache.authSecretName" -}}
{{- default (printf "%s-api-keys" (include "vericache.fullname" .)) .Values.auth.secretName }}
{{- end }}

{{/* --tls-* flags for every daemon (its port and its calls to the others). */}}
{{- define "vericache.tlsArgs" -}}
{{- if .Values.tls.enabled }}
- --tls-cert={{ .Values.tls.mountPath }}/tls.crt
- --tls-key={{ .Values.tls.mountPath }}/tls.key
- --tls-ca={{ .Values.tls.mountPath }}/ca.crt
{{- end }}
{{- end }}

{{- define "vericache.tlsMount" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: {{ .Values.tls.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/* Mounted as a directory (no subPath): the kubelet swaps it atomically on
renewal and the daemons re-read it without a restart. */}}
{{- define "vericache.tlsVolume" -}}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "vericache.tlsSecretName" . }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{/*
Probes for a daemon's gRPC port: Kubernetes' native gRPC probes speak
plaintext only, so with TLS on the probes check that the port accepts TCP
connections (the daemons' own health service stays reachable over mTLS).
Usage: include "vericache.probes" (dict "root" $ "port" 7400 "startupSeconds" 120)
*/}}
{{- define "vericache.probes" -}}
{{- if .root.Values.tls.enabled }}
startupProbe:
  tcpSocket:
    port: {{ .port }}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: {{ max 1 (div (int .startupSeconds) 5) }}
readinessProbe:
  tcpSocket:
    port: {{ .port }}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
livenessProbe:
  tcpSocket:
    port: {{ .port }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
{{- else }}
{{- include "vericache.grpcProbes" (dict "port" .port "startupSeconds" .startupSeconds) }}
{{- end }}
{{- end }}

{{/* The NetworkPolicy ingress rule for /metrics (networkPolicy.metricsFrom). */}}
{{- define "vericache.metricsIngress" -}}
{{- if .Values.metrics.enabled }}
- from:
    {{- toYaml .Values.networkPolicy.metricsFrom | nindent 4 }}
  ports:
    - port: {{ .Values.metrics.port }}
      protocol: TCP
{{- end }}
{{- end }}
