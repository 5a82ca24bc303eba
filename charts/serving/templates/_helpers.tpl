{{/*
serving.name is the chart name, or nameOverride.
*/}}
{{- define "serving.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
serving.fullname is the prefix of every resource name: the release name, plus the chart name unless
the release name already contains it. Truncated to 54 so that "-operator" still fits in 63 (DNS label).
*/}}
{{- define "serving.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 54 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
serving.operatorName names the operator's Deployment, Service and (by default) ServiceAccount and RBAC.
*/}}
{{- define "serving.operatorName" -}}
{{- printf "%s-operator" (include "serving.fullname" .) }}
{{- end }}

{{/*
serving.chart is the chart name and version, for the helm.sh/chart label.
*/}}
{{- define "serving.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
serving.selectorLabels select the operator's pods; they never change between releases.
*/}}
{{- define "serving.selectorLabels" -}}
app.kubernetes.io/name: {{ include "serving.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
serving.labels are the common labels of every resource.
*/}}
{{- define "serving.labels" -}}
helm.sh/chart: {{ include "serving.chart" . }}
{{ include "serving.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: servinglab
{{- end }}

{{/*
serving.serviceAccountName is the operator's ServiceAccount.
*/}}
{{- define "serving.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "serving.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
serving.watchNamespaces is the JSON list of namespaces the operator runs experiments in
(watchNamespaces, or the release namespace); unused with watchAllNamespaces.
*/}}
{{- define "serving.watchNamespaces" -}}
{{- if .Values.watchNamespaces }}
{{- toJson .Values.watchNamespaces }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/*
serving.operatorRules are the RBAC rules the operator needs, the same namespaced or cluster-wide.
Each rule says why; tests/k8s/test_chart.py checks them both ways with `kubectl auth can-i`.
*/}}
{{- define "serving.operatorRules" -}}
# Watch experiments and sweeps; patch them for kopf's finalizer and bookkeeping annotations. A sweep's
# trials are experiments it server-side applies (create); its owner reference deletes them with it.
- apiGroups: ["servinglab.dev"]
  resources: ["servingexperiments"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["servinglab.dev"]
  resources: ["servingsweeps"]
  verbs: ["get", "list", "watch", "patch"]
# Write conditions and results.
- apiGroups: ["servinglab.dev"]
  resources: ["servingexperiments/status", "servingsweeps/status"]
  verbs: ["patch"]
# Children carry blockOwnerDeletion owner references; clusters that enforce OwnerReferencesPermissionEnforcement
# require update on the owner's finalizers for that (no finalizer is ever written through it).
- apiGroups: ["servinglab.dev"]
  resources: ["servingexperiments/finalizers", "servingsweeps/finalizers"]
  verbs: ["update"]
# Leader election is not here: its one Lease lives in one namespace, granted by the leader-election Role
# there (role-leader-election.yaml), never in every namespace (cluster-wide: kube-system's Leases too).
# Server config, results ConfigMap, the load Job's ServiceAccount: server-side applied (create+patch),
# results read back (get). Never deleted by the operator: garbage collection follows the owner.
- apiGroups: [""]
  resources: ["configmaps", "serviceaccounts"]
  verbs: ["get", "create", "patch"]
# The server's Service: applied, and deleted when the experiment ends (spec.cleanup).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "patch", "delete"]
# The server Deployment and the load Job: applied, watched for progress, deleted on cleanup.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "create", "patch", "delete"]
# Pod status explains failures: unschedulable (scheduler message), crashed (exit code), not ready.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
# The load Job may write only its own results ConfigMaps: the operator creates that Role and binding
# (RBAC lets it grant only what it holds itself: configmaps get/patch/create).
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "create", "patch"]
# The namespace's own pod defaults (PodNodeSelector and PodTolerationRestriction annotations), which the
# GPU queue adds to a server's node selector and tolerations. In a Role this grants reading only the
# Namespace object of the Role's own namespace.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get"]
# The namespace's ResourceQuotas on GPUs: the GPU queue waits while admitting an experiment would exceed
# one (its server's pods would be refused). List and watch only.
- apiGroups: [""]
  resources: ["resourcequotas"]
  verbs: ["list", "watch"]
# Events on each experiment's transitions.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# Several load pods: the key they prove to each other, one Secret per experiment. Created only (named by
# the API server, the name kept in status): no get/list/watch, which would read every Secret here.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
# Several load pods: a NetworkPolicy admitting their coordination port only from the same experiment's
# load pods; server-side applied (create+patch), checked for a foreign one of its name (get).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch"]
{{- end }}

{{/*
serving.leaseNamespace is where the operator keeps its leader-election Lease: its own namespace (the
release's), whatever namespaces it watches, so every replica of this install contends for the same one
(servinglab.k8s.settings.own_namespace reads it from the pod's namespace).
*/}}
{{- define "serving.leaseNamespace" -}}
{{- .Release.Namespace }}
{{- end }}

{{/*
serving.operatorUsername is the user the API server sees for requests with the operator's token.
*/}}
{{- define "serving.operatorUsername" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "serving.serviceAccountName" .) }}
{{- end }}
