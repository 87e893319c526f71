"""Pure builders: (run, spec, plan) -> the Kubernetes manifests an RLRun owns.

No I/O and no kopf here, so every manifest is unit-tested without a cluster.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from rlscale.plan import Plan
from rlscale.runconfig import RunConfig
from rlscale.spec import RLRunSpec
from rlscale.spec.tools import TOOL_SERVER_PORT, pods

from . import constants as C
from .availability import build_disruption_budgets
from .egress import egress_rules
from .learner_pods import COLOCATED_ROLLOUT_METRICS_PORT, colocated, learner_pod
from .learner_pods import learner_grace_seconds as learner_grace_seconds  # re-exported
from .naming import RunRef, labels, names, object_meta
from .pods import (
    container_ports,
    object_store_bytes,
    pod_spec,
    role_env,
    role_resources,
    template_meta,
)
from .tool_pods import build_tool_pods, exclude_tool_pods


@dataclass(frozen=True)
class Images:
    """What the children get when the spec says nothing: images, checkpoint claims, the network
    policy (the operator's settings carry one, from the chart's values)."""

    trainer: str = C.DEFAULT_TRAINER_IMAGE
    rollout: str = C.DEFAULT_ROLLOUT_IMAGE
    checkpoint_storage: str = ""  # e.g. "50Gi": learner rank volumes; "" = emptyDir
    # A NetworkPolicy per run, and the namespaces whose pods may scrape its metrics port.
    network_policy: bool = True
    metrics_from: tuple[str, ...] = ("monitoring",)
    # Egress of the run's pods (operator/egress.py): "restricted" (the run's own needs and egress_cidrs) or
    # "open"; api_server: the API server's (address, port) endpoints, found by the controller.
    egress: str = "restricted"
    egress_cidrs: tuple[str, ...] = ()
    api_server: tuple[tuple[str, int], ...] = ()


def run_images(defaults: Images, record: Mapping[str, Any] | None) -> Images:
    """The defaults a run's children are built from: the images recorded in its status
    (status.images, see images_record) where there is a record, else the operator's current ones.
    So a `helm upgrade` with new run images leaves a running run's pods as they are."""
    rec = record if isinstance(record, Mapping) else {}
    return replace(defaults, trainer=str(rec.get("trainer") or defaults.trainer),
                   rollout=str(rec.get("rollout") or defaults.rollout))


def images_record(spec: RLRunSpec, images: Images) -> dict[str, str]:
    """status.images: the default images the run's pods run, by the role that takes them (trainer:
    the learner and the Ray head, rollout); a role whose spec names its image has none."""
    rec = {"trainer": images.trainer, "rollout": images.rollout}
    if spec.learner.image:
        del rec["trainer"]
    if spec.rollout.image:
        del rec["rollout"]
    return rec


def plan_hash(plan: Plan) -> str:
    """The plan the workloads were built from (their annotation), as status.plan shows it."""
    return hashlib.sha256(json.dumps(plan.to_dict(candidates=False), sort_keys=True).encode()).hexdigest()[:12]


def desired_replicas(spec: RLRunSpec, plan: Plan | None, finished: bool = False,
                     admitted: dict[str, int] | None = None, draining: int | None = None) -> dict[str, int]:
    """Replicas by role: the plan's, zero while suspended, and zero (the Ray head too) once
    the run has ended, so its accelerators are free. `admitted` (a run queued in Kueue): the
    counts Kueue admitted by role, all zero until it has; no role runs more than that.
    `draining`: rollout replicas to keep at least: learner pods are still stopping, so the
    rollout replicas (this many) and the head stay until they are gone: rank 0's last step, and
    its checkpoint on SIGTERM, need both (stopped together, the replicas could go first and the
    step never finish); or the driver has not yet drained Serve to a smaller plan (ordered
    scaling, operator/scaling.py). Once the run has ended, `draining` counts its rollout pods still
    stopping: the head stays until they are gone (scaling.stopping). `plan` None: the
    Ray head's count alone is asked for. A colocated plan has no rollout pods: its replicas run on the
    learner pods (operator/learner_pods.py)."""
    if finished:
        return {C.ROLE_RAY_HEAD: 1 if draining else 0, C.ROLE_ROLLOUT: 0, C.ROLE_LEARNER: 0}
    if spec.suspend or plan is None:
        out = {C.ROLE_RAY_HEAD: 1, C.ROLE_ROLLOUT: 0, C.ROLE_LEARNER: 0}
    else:
        rollout = 0 if colocated(plan) else plan.rollout_replicas
        out = {C.ROLE_RAY_HEAD: 1, C.ROLE_ROLLOUT: rollout, C.ROLE_LEARNER: plan.learner_replicas}
    if admitted is not None:
        out = {role: min(n, int(admitted.get(role, 0))) for role, n in out.items()}
    if draining is not None and not colocated(plan):
        out[C.ROLE_ROLLOUT] = max(out[C.ROLE_ROLLOUT], draining)
        if out[C.ROLE_LEARNER] == 0:
            out[C.ROLE_RAY_HEAD] = 1
    return out


def report_dir(spec: RLRunSpec) -> str:
    return f"{spec.checkpoint.path.rstrip('/')}/{C.REPORT_DIR}"


def run_config(run: RunRef, spec: RLRunSpec, plan: Plan) -> RunConfig:
    """The resolved run config every role reads from the mounted ConfigMap. The plan goes without
    its candidates, as status.plan keeps it: a fresh plan and the same plan read back from status
    then write the same ConfigMap (no edit reaches the pods for nothing)."""
    n = names(run.name)
    return RunConfig(
        run=run.name, namespace=run.namespace, spec=spec, plan=replace(plan, candidates=[]),
        ray_address=f"{n[C.ROLE_RAY_HEAD]}.{run.namespace}.svc:{C.RAY_GCS_PORT}",
        metrics_port=C.METRICS_PORT, checkpoint_dir=spec.checkpoint.path, report_dir=report_dir(spec),
        # The pods resolve the model inside the model volume (built or looked up there).
        model_cache=C.MODEL_MOUNT, object_store_bytes=object_store_bytes(spec),
    )


def build_configmap(run: RunRef, spec: RLRunSpec, plan: Plan) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": object_meta(run, names(run.name)[C.ROLE_CONFIG], C.ROLE_CONFIG),
        "data": {C.CONFIG_KEY: run_config(run, spec, plan).to_json()},
    }


def build_ray_token_secret(run: RunRef, token: str) -> dict[str, Any]:
    """The run's Ray token; created once (never re-applied: a new token would lock out the
    running pods), deleted with the run."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": object_meta(run, names(run.name)[C.ROLE_TOKEN], C.ROLE_TOKEN),
            "stringData": {C.TOKEN_KEY: token}}


def new_ray_token() -> str:
    """A fresh random token (Ray asks for 32 characters at least)."""
    import secrets

    return secrets.token_hex(32)


def build_network_policy(run: RunRef, metrics_from: tuple[str, ...],
                         metrics_ports: tuple[int, ...] = (C.METRICS_PORT,), images: Images | None = None,
                         download: bool = False, tools: bool = False) -> dict[str, Any]:
    """Ingress to the run's pods: any port from the run's own pods (Ray and the ranks use
    many), the metrics ports from the monitoring namespaces; nothing else. Egress: the run's own
    needs only (operator/egress.py), unless the chart's networkPolicy.egress is open. `tools`: the run
    has tool pods, which this policy leaves to their own (operator/tool_pods.py) but for the learner
    pods' calls to them."""
    images = images or Images()
    run_pods = {"matchLabels": {C.LABEL_RUN: run.name}}
    if tools:
        run_pods = exclude_tool_pods(run_pods)
    own = {"podSelector": run_pods}
    rules: list[dict[str, Any]] = [{"from": [own]}]
    if metrics_from:
        rules.append({"from": [{"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": sorted(metrics_from)}]}}],
            "ports": [{"port": p, "protocol": "TCP"} for p in metrics_ports]})
    spec: dict[str, Any] = {"podSelector": copy.deepcopy(run_pods), "policyTypes": ["Ingress"], "ingress": rules}
    if images.egress != "open":
        spec["policyTypes"].append("Egress")
        spec["egress"] = egress_rules(own, images.api_server, images.egress_cidrs, download)
        if tools:
            spec["egress"].append({"to": [{"podSelector": {"matchLabels": {C.LABEL_RUN: run.name,
                                                                           C.LABEL_ROLE: C.ROLE_TOOLS}}}],
                                   "ports": [{"port": TOOL_SERVER_PORT, "protocol": "TCP"}]})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": object_meta(run, names(run.name)[C.ROLE_NETWORK], C.ROLE_NETWORK), "spec": spec}


def build_ray_head(run: RunRef, spec: RLRunSpec, images: Images, finished: bool = False,
                   admitted: dict[str, int] | None = None, draining: int | None = None) -> dict[str, Any]:
    """The run's Ray head: a one-pod Deployment (CPU only) that stays up while the run is
    suspended and goes to zero once the run has ended."""
    n = names(run.name)
    pod = pod_spec(
        run, spec, C.ROLE_RAY_HEAD, spec.learner.image or images.trainer,
        ["rlscale", "ray-head", "--config", C.CONFIG_PATH], role_env(run, spec),
        {"requests": {"cpu": "100m", "memory": "1Gi"}},
        # What the head serves (no dashboard, no Serve HTTP proxy): GCS and Ray Client.
        container_ports(("gcs", C.RAY_GCS_PORT), ("client", C.RAY_CLIENT_PORT)),
    )
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": object_meta(run, n[C.ROLE_RAY_HEAD], C.ROLE_RAY_HEAD),
        "spec": {
            "replicas": desired_replicas(spec, None, finished, admitted, draining)[C.ROLE_RAY_HEAD],
            # Never two heads of one run: the old one goes before its replacement starts.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {C.LABEL_RUN: run.name, C.LABEL_ROLE: C.ROLE_RAY_HEAD}},
            "template": {"metadata": template_meta(run, spec, C.ROLE_RAY_HEAD), "spec": pod},
        },
    }


def build_ray_head_service(run: RunRef) -> dict[str, Any]:
    n = names(run.name)
    ports = [{"name": nm, "port": p, "targetPort": p, "protocol": "TCP"}
             for nm, p in (("gcs", C.RAY_GCS_PORT), ("client", C.RAY_CLIENT_PORT))]
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": object_meta(run, n[C.ROLE_RAY_HEAD], C.ROLE_RAY_HEAD),
            # The head's readiness (its GCS answers) does not gate the Service: a probe that misses
            # (a kubelet restart, a busy node) must not cut the run's nodes off their GCS.
            "spec": {"selector": labels(run.name, C.ROLE_RAY_HEAD), "publishNotReadyAddresses": True,
                     "ports": ports}}


def build_rollout_deployment(run: RunRef, spec: RLRunSpec, plan: Plan, images: Images,
                             finished: bool = False, admitted: dict[str, int] | None = None,
                             draining: int | None = None) -> dict[str, Any]:
    """vLLM replicas; the count comes from the plan (zero while suspended or once ended)."""
    n = names(run.name)
    gpu = spec.hardware.accelerator != "cpu"
    env = role_env(run, spec, [{"name": "RAY_ADDRESS",
                            "value": f"{n[C.ROLE_RAY_HEAD]}.{run.namespace}.svc:{C.RAY_GCS_PORT}"},
                           # How long the pod's Ray node drains on SIGTERM (constants.ROLLOUT_DRAIN_S).
                           {"name": "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "value": str(C.ROLLOUT_DRAIN_S)}])
    # Replicas load the model from the path rank 0 names: the shared volume read-only, or
    # (no volume named) a copy this pod prepares itself.
    shared = spec.model.volume is not None
    # No preStop hook: the process that needs time on a stop, the pod's Ray node, takes SIGTERM itself
    # and drains its replica (a pod the operator removes after a scale-down hosts none: it exits at once).
    pod = pod_spec(run, spec, C.ROLE_ROLLOUT, spec.rollout.image or images.rollout,
                    ["rlscale", "rollout", "--config", C.CONFIG_PATH], env,
                    role_resources(spec.rollout, gpu), container_ports(("metrics", C.METRICS_PORT)),
                    model="ro" if shared else "rw", init_model=not shared, grace_seconds=C.ROLLOUT_GRACE_S)
    meta = object_meta(run, n[C.ROLE_ROLLOUT], C.ROLE_ROLLOUT, {C.ANNOTATION_PLAN_HASH: plan_hash(plan)})
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": desired_replicas(spec, plan, finished, admitted, draining)[C.ROLE_ROLLOUT],
            # A pod is Ready once a Serve replica runs on it, and Serve runs the driver's count of
            # replicas, all placed: an extra (surge) pod would get none and the update would wait
            # for it forever. So an old pod goes first and Serve re-places its replica on the new
            # one (which needs no spare GPU either).
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "selector": {"matchLabels": {C.LABEL_RUN: run.name, C.LABEL_ROLE: C.ROLE_ROLLOUT}},
            "template": {"metadata": template_meta(run, spec, C.ROLE_ROLLOUT), "spec": pod},
        },
    }


def build_learner_statefulset(run: RunRef, spec: RLRunSpec, plan: Plan, images: Images,
                              finished: bool = False, admitted: dict[str, int] | None = None) -> dict[str, Any]:
    """DeepSpeed ranks, one pod per node and G ranks a pod (operator/learner_pods.py): rank 0 is
    MASTER_ADDR, the driver and a Ray node; colocated, every pod's Ray node hosts a rollout replica."""
    n = names(run.name)
    pod, claims = learner_pod(run, spec, plan, spec.learner.image or images.trainer, images.checkpoint_storage)
    meta = object_meta(run, n[C.ROLE_LEARNER], C.ROLE_LEARNER, {C.ANNOTATION_PLAN_HASH: plan_hash(plan)})
    sts: dict[str, Any] = {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": meta,
        "spec": {
            "replicas": desired_replicas(spec, plan, finished, admitted)[C.ROLE_LEARNER],
            "serviceName": n[C.ROLE_LEARNER],
            # Ranks rendezvous with each other: start them together, not one by one.
            "podManagementPolicy": "Parallel",
            # A changed template replaces every rank at once: a rank is Ready only once all of them
            # have joined, and ranks of two templates (another WORLD_SIZE) never join each other, so
            # one at a time would wait forever for the first. Ignored where the API server lacks
            # MaxUnavailableStatefulSet (beta, on by default, since Kubernetes 1.35).
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
            "selector": {"matchLabels": {C.LABEL_RUN: run.name, C.LABEL_ROLE: C.ROLE_LEARNER}},
            "template": {"metadata": template_meta(run, spec, C.ROLE_LEARNER), "spec": pod},
        },
    }
    if claims:
        sts["spec"]["volumeClaimTemplates"] = claims
        # The ranks' checkpoints outlive the RLRun unless it says otherwise (spec.checkpoint.claimRetention):
        # Retain leaves the claims no owner, so deleting the run (by mistake too) keeps them, and a run of
        # the same name resumes from them. The StatefulSet controller labels them with the run's selector.
        sts["spec"]["persistentVolumeClaimRetentionPolicy"] = {"whenScaled": "Retain",
                                                               "whenDeleted": spec.checkpoint.claim_retention}
    return sts


def build_learner_service(run: RunRef) -> dict[str, Any]:
    """Headless: gives each rank a stable DNS name (rank 0 is MASTER_ADDR)."""
    n = names(run.name)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": object_meta(run, n[C.ROLE_LEARNER], C.ROLE_LEARNER),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": labels(run.name, C.ROLE_LEARNER),
                     "ports": [{"name": "master", "port": C.MASTER_PORT, "targetPort": C.MASTER_PORT}]}}


def build_metrics_service(run: RunRef, colocated_rollout: bool = False) -> dict[str, Any]:
    """One Service over every pod of the run, port `metrics`, for ServiceMonitor scraping; with the
    rollout colocated, also `rollout-metrics` (the replicas on the learner pods)."""
    n = names(run.name)
    ports = [{"name": "metrics", "port": C.METRICS_PORT, "targetPort": "metrics"}]
    if colocated_rollout:
        ports.append({"name": "rollout-metrics", "port": COLOCATED_ROLLOUT_METRICS_PORT,
                      "targetPort": "rollout-metrics"})
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": object_meta(run, n[C.ROLE_METRICS], C.ROLE_METRICS),
            # Pods are scraped whether or not they are Ready (a replica still loading, a rank rejoining).
            "spec": {"selector": {C.LABEL_RUN: run.name}, "publishNotReadyAddresses": True, "ports": ports}}


def build_runner_account(run: RunRef) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding for the run's pods: get and patch this RLRun only
    (rank 0 reports progress in an annotation)."""
    n = names(run.name)[C.ROLE_RUNNER]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": object_meta(run, n, C.ROLE_RUNNER)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": object_meta(run, n, C.ROLE_RUNNER),
         "rules": [{"apiGroups": [C.GROUP], "resources": [C.PLURAL], "resourceNames": [run.name],
                    "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": object_meta(run, n, C.ROLE_RUNNER),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": n},
         "subjects": [{"kind": "ServiceAccount", "name": n, "namespace": run.namespace}]},
    ]


def build_children(run: RunRef, spec: RLRunSpec, plan: Plan, images: Images | None = None,
                   finished: bool = False, admitted: dict[str, int] | None = None,
                   draining: int | None = None) -> list[dict[str, Any]]:
    """Everything the run owns; the ConfigMap and the pods' account first (pods need both).
    `finished`: the run has ended, so every workload is at zero. `admitted`, `draining`: see
    desired_replicas. A colocated plan has no rollout Deployment (nor its budget): the replicas
    run on the learner pods."""
    images = images or Images()
    co = colocated(plan)
    scrape = (C.METRICS_PORT, COLOCATED_ROLLOUT_METRICS_PORT) if co else (C.METRICS_PORT,)
    budgets = [b for b in build_disruption_budgets(run, spec, finished)
               if not (co and b["metadata"]["labels"][C.LABEL_ROLE] == C.ROLE_ROLLOUT)]
    tools = pods(spec.task)
    learners = desired_replicas(spec, plan, finished, admitted)[C.ROLE_LEARNER]
    return [
        build_configmap(run, spec, plan),
        *build_runner_account(run),
        *([build_network_policy(run, images.metrics_from, scrape, images, spec.model.download, tools)]
          if images.network_policy else []),
        # The tool pods' Service, NetworkPolicy (always: it is the sandbox's, not the run's) and Deployment.
        *build_tool_pods(run, spec, spec.learner.image or images.trainer, learners),
        build_ray_head_service(run),
        build_learner_service(run),
        build_metrics_service(run, co),
        *budgets,
        # Before any pod that names it.
        *([build_pod_group(run, spec, plan)] if spec.scheduling.pod_group else []),
        build_ray_head(run, spec, images, finished, admitted, draining),
        *([] if co else [build_rollout_deployment(run, spec, plan, images, finished, admitted, draining)]),
        build_learner_statefulset(run, spec, plan, images, finished, admitted),
    ]


# How long the Coscheduling plugin holds a partly placed group before it gives the nodes back
# and retries.
POD_GROUP_TIMEOUT_S = 300


def build_pod_group(run: RunRef, spec: RLRunSpec, plan: Plan) -> dict[str, Any]:
    """The Coscheduling PodGroup every pod of the run belongs to (the label in
    template_meta): minMember is the planned pod count, so the scheduler binds all of them or
    none, and a run never holds half its GPUs waiting for the rest."""
    planned = desired_replicas(spec.model_copy(update={"suspend": False}), plan)
    return {"apiVersion": C.POD_GROUP_API, "kind": "PodGroup",
            "metadata": object_meta(run, names(run.name)[C.ROLE_GANG], C.ROLE_GANG),
            "spec": {"minMember": sum(planned.values()), "scheduleTimeoutSeconds": POD_GROUP_TIMEOUT_S}}


# Kueue pod sets, in the order the Workload lists them.
QUEUED_ROLES = (C.ROLE_RAY_HEAD, C.ROLE_ROLLOUT, C.ROLE_LEARNER)


def build_workload(run: RunRef, spec: RLRunSpec, plan: Plan,
                   children: list[dict[str, Any]]) -> dict[str, Any]:
    """Kueue's Workload for a queued run (spec.scheduling.queueName): one pod set per role at
    the planned count, with the pod templates the operator runs, so Kueue admits the whole run
    or none of it. `active` follows spec.suspend (an inactive Workload gives its quota back)."""
    counts = desired_replicas(spec.model_copy(update={"suspend": False}), plan)
    templates = {m["metadata"]["labels"][C.LABEL_ROLE]: m["spec"]["template"]
                 for m in children if m["kind"] in ("Deployment", "StatefulSet")}
    # A colocated run has no rollout pods, so no rollout pod set (admitted_counts reads it as 0).
    pod_sets = [{"name": role, "count": counts[role], "template": copy.deepcopy(templates[role])}
                for role in QUEUED_ROLES if role in templates]
    return {"apiVersion": C.KUEUE_API, "kind": "Workload",
            "metadata": object_meta(run, names(run.name)[C.ROLE_QUEUE], C.ROLE_QUEUE),
            "spec": {"queueName": spec.scheduling.queue_name, "active": not spec.suspend, "podSets": pod_sets}}


def admitted_counts(workload: dict[str, Any] | None) -> dict[str, int]:
    """Pods per role Kueue admitted (status.admission), all zero until it has admitted the
    Workload, or once it has evicted it."""
    st = (workload or {}).get("status") or {}
    conds = {c.get("type"): c.get("status") for c in st.get("conditions") or []}
    if not st.get("admission") or conds.get("Admitted") != "True" or conds.get("Evicted") == "True":
        return dict.fromkeys(QUEUED_ROLES, 0)
    got = {a["name"]: int(a.get("count") or 0) for a in st["admission"].get("podSetAssignments") or []}
    return {role: got.get(role, 0) for role in QUEUED_ROLES}
