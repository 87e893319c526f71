{{- define "rlscale.rules" -}}
# The RLRuns: watch them, keep kopf's bookkeeping annotations, write status.
- apiGroups: [rlscale.dev]
  resources: [rlruns]
  verbs: [get, list, watch, patch]
- apiGroups: [rlscale.dev]
  resources: [rlruns/status]
  verbs: [get, patch]
# Children carry an owner reference that blocks the RLRun's deletion until they are gone;
# setting one needs update on the owner's finalizers where the API server enforces it.
- apiGroups: [rlscale.dev]
  resources: [rlruns/finalizers]
  verbs: [update]
# What each run owns (server-side apply = patch; it also creates).
- apiGroups: [""]
  resources: [configmaps, services]
  verbs: [get, list, watch, create, patch]
# A run's namespace: whether it carries a Pod Security enforce label (policy.requirePodSecurity).
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get]
# The run's pods come from its workloads; the operator reads them, and patches one annotation,
# controller.kubernetes.io/pod-deletion-cost, on rollout pods whose replica the driver has drained,
# so a scale-down removes exactly those (ordered scaling). It never deletes a pod.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch]
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, list, watch, create, patch]
# Each run's Ray token: created once, never read back or changed by the operator.
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
{{- if .Values.policy.secretLabel }}
# policy.secretLabel: the Secrets a run names are read for their labels.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}
{{- if .Values.policy.claimLabel }}
# policy.claimLabel: the claims a run names are read for their labels.
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get]
{{- end }}
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch]
# The API server's endpoints (the EndpointSlice `kubernetes` in namespace default): the runs' egress
# allows those and not every address on port 443 (operator/egress.py).
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  resourceNames: [kubernetes]
  verbs: [get]
# Each run's PodDisruptionBudgets (one per role): voluntary evictions wait while the run trains.
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch]
# Each run's pods get a Role that may only get and patch their own RLRun (progress reports);
# granting it needs the operator to hold the same rights, which it does above.
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, watch, create, patch]
- apiGroups: [apps]
  resources: [deployments, statefulsets]
  verbs: [get, list, watch, create, patch]
# Runs with spec.scheduling.queueName: the operator creates each run's Kueue Workload, keeps
# its spec in step while it waits, gives an evicted run's reservation back and marks it
# Finished (status); Kueue admits it. Without Kueue installed these rules are unused.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch, create, patch]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [get, patch]
# Runs with spec.scheduling.podGroup: each run's Coscheduling PodGroup (scheduler-plugins).
- apiGroups: [scheduling.x-k8s.io]
  resources: [podgroups]
  verbs: [get, list, watch, create, patch]
# Failures of a run's pods, and kopf's handler failures, are reported as events on the RLRun.
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create]
{{- end -}}
