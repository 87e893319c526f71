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

from rlscale.plan import Plan, model_shape_for
from rlscale.runconfig import RunConfig
from rlscale.spec import RLRunSpec

from . import constants as C
from .availability import build_disruption_budgets, readiness_probe
from .naming import RunRef, labels, names, object_meta


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
    scaling, operator/scaling.py). `plan` None: the Ray head's count alone is asked for."""
    if finished:
        return {C.ROLE_RAY_HEAD: 0, C.ROLE_ROLLOUT: 0, C.ROLE_LEARNER: 0}
    if spec.suspend or plan is None:
        out = {C.ROLE_RAY_HEAD: 1, C.ROLE_ROLLOUT: 0, C.ROLE_LEARNER: 0}
    else:
        out = {C.ROLE_RAY_HEAD: 1, C.ROLE_ROLLOUT: plan.rollout_replicas, C.ROLE_LEARNER: plan.learner_replicas}
    if admitted is not None:
        out = {role: min(n, int(admitted.get(role, 0))) for role, n in out.items()}
    if draining is not None:
        out[C.ROLE_ROLLOUT] = max(out[C.ROLE_ROLLOUT], draining)
        if out[C.ROLE_LEARNER] == 0:
            out[C.ROLE_RAY_HEAD] = 1
    return out


def object_store_bytes(spec: RLRunSpec) -> int:
    """Ray object store per node: room for a few published weight versions, 256 MiB at least."""
    weights = model_shape_for(spec.model).weight_bytes(spec.model.dtype)
    return int(max(256 * 2**20, 3 * weights))


def shm_size(spec: RLRunSpec) -> str:
    """The memory-backed /dev/shm: the object store plus room for torch's shared memory."""
    return f"{(object_store_bytes(spec) + 512 * 2**20) // 2**20}Mi"


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


def _resources(role_spec: Any, gpu: bool) -> dict[str, Any]:
    """The spec's resources plus the GPU request (a GPU request must equal its limit)."""
    res = copy.deepcopy(role_spec.resources) if role_spec.resources else {}
    if gpu and role_spec.gpus_per_replica > 0:
        n = str(role_spec.gpus_per_replica)
        res.setdefault("limits", {})[C.GPU_RESOURCE] = n
        res.setdefault("requests", {})[C.GPU_RESOURCE] = n
    return res


def _env(run: RunRef, spec: RLRunSpec, extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    return [
        {"name": "RLSCALE_CONFIG", "value": C.CONFIG_PATH},
        {"name": "HOME", "value": C.HOME_MOUNT},
        {"name": "HF_HOME", "value": C.HF_HOME},
        {"name": "HF_HUB_OFFLINE", "value": "0" if spec.model.download else "1"},
        {"name": "RLSCALE_RUN", "value": run.name},
        {"name": "RLSCALE_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        # Every Ray call (GCS, client, node to node) carries the run's own token: a pod of
        # another run, or anyone else in the cluster, is refused.
        {"name": "RAY_AUTH_MODE", "value": "token"},
        {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": names(run.name)[C.ROLE_TOKEN],
                                                                  "key": C.TOKEN_KEY}}},
        *(extra or []),
    ]


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


def build_network_policy(run: RunRef, metrics_from: tuple[str, ...]) -> dict[str, Any]:
    """Ingress to the run's pods: any port from the run's own pods (Ray and the ranks use
    many), the metrics port from the monitoring namespaces; nothing else. Egress is left open
    (the API server, DNS, and the hub where model.download is set)."""
    own = {"podSelector": {"matchLabels": {C.LABEL_RUN: run.name}}}
    rules: list[dict[str, Any]] = [{"from": [own]}]
    if metrics_from:
        rules.append({"from": [{"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": sorted(metrics_from)}]}}],
            "ports": [{"port": C.METRICS_PORT, "protocol": "TCP"}]})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": object_meta(run, names(run.name)[C.ROLE_NETWORK], C.ROLE_NETWORK),
            "spec": {"podSelector": {"matchLabels": {C.LABEL_RUN: run.name}},
                     "policyTypes": ["Ingress"], "ingress": rules}}


def _model_volume(spec: RLRunSpec) -> dict[str, Any]:
    """The volume the spec names for the model, else an emptyDir each pod fills itself."""
    return {"name": "model", **(copy.deepcopy(spec.model.volume) if spec.model.volume else {"emptyDir": {}})}


# The `restricted` Pod Security profile: the images run as uid 1000 (images/torch), write
# only to HOME and /tmp (emptyDirs below) and need no capability.
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": C.RUN_AS_USER, "runAsGroup": C.RUN_AS_USER,
                "fsGroup": C.RUN_AS_USER, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                      "capabilities": {"drop": ["ALL"]}}


def _container(name: str, image: str, command: list[str], env: list[dict[str, Any]],
               mounts: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {"name": name, "image": image, "command": command, "env": env, **more, "volumeMounts": mounts,
            "securityContext": copy.deepcopy(CONTAINER_SECURITY),
            # A container that dies leaves its last log lines in its status: the operator's
            # Degraded and Failed conditions quote them.
            "terminationMessagePolicy": "FallbackToLogsOnError"}


def _pod_spec(run: RunRef, spec: RLRunSpec, role: str, image: str, command: list[str], env: list[dict[str, Any]],
              resources: dict[str, Any], ports: list[dict[str, Any]],
              extra_volumes: list[dict[str, Any]] | None = None,
              extra_mounts: list[dict[str, Any]] | None = None, model: str | None = None,
              init_model: bool = False, token: bool = False, grace_seconds: int | None = None) -> dict[str, Any]:
    """One role's pod. `model`: mount the model volume "ro" or "rw"; `init_model`: prepare it
    first; `token`: mount the run account's API token (only the driver patches the RLRun)."""
    mounts = [{"name": "run-config", "mountPath": C.CONFIG_MOUNT_DIR, "readOnly": True},
              {"name": "shm", "mountPath": C.SHM_MOUNT},
              {"name": "home", "mountPath": C.HOME_MOUNT}, {"name": "tmp", "mountPath": "/tmp"}]
    volumes = [{"name": "run-config", "configMap": {"name": names(run.name)[C.ROLE_CONFIG]}},
               # Ray's object store lives in /dev/shm: a container's default 64 MiB would send
               # every weight publish to disk.
               {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(spec)}},
               # The root filesystem is read-only: caches and JIT builds go to HOME, Ray's
               # session files to /tmp.
               {"name": "home", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}]
    if model:
        mounts.append({"name": "model", "mountPath": C.MODEL_MOUNT, "readOnly": model == "ro"})
        volumes.append(_model_volume(spec))
    over = _overrides(spec, role)
    env = [*env, *over.get("env", [])]
    container = _container(role, image, command, env,
                           [*mounts, *(extra_mounts or []), *over.get("volumeMounts", [])],
                           ports=ports, resources=resources, readinessProbe=readiness_probe(role))
    pod: dict[str, Any] = {
        # The run's own account: it may read and annotate its RLRun (progress), nothing else.
        "serviceAccountName": names(run.name)[C.ROLE_RUNNER],
        "automountServiceAccountToken": token,
        "securityContext": copy.deepcopy(POD_SECURITY),
        "containers": [container],
        # The config map is mounted as a directory so edits reach running pods (no subPath).
        "volumes": [*volumes, *(extra_volumes or []), *over.get("volumes", [])],
    }
    if grace_seconds is not None:
        pod["terminationGracePeriodSeconds"] = grace_seconds
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName", "imagePullSecrets",
                "runtimeClassName", "schedulerName"):
        if over.get(key):
            pod[key] = over[key]
    if init_model:
        # Builds a builtin model into the model volume once (a file lock serialises pods), or
        # checks that a hub id or directory is there, before the role starts.
        init_mounts = [m for m in mounts if m["name"] in ("run-config", "model", "home", "tmp")]
        pod["initContainers"] = [_container("model", image, ["rlscale", "prepare-model", "--config", C.CONFIG_PATH],
                                            env, init_mounts)]
    return pod


def _overrides(spec: RLRunSpec, role: str) -> dict[str, Any]:
    """The spec's pod settings for a role in pod-spec form: the role's own `pod` block over
    `scheduling`. The Ray head runs the learner's image beside the learners: it takes the learner's
    pull secrets and placement (node selector, tolerations, affinity), so it starts wherever the
    learners may (a private registry, a tainted pool), and nothing else of theirs."""
    out: dict[str, Any] = {}
    sched = spec.scheduling
    if sched.scheduler_name:
        out["schedulerName"] = sched.scheduler_name
    if sched.priority_class_name:
        out["priorityClassName"] = sched.priority_class_name
    if role == C.ROLE_RAY_HEAD:
        learner = spec.learner.pod.model_dump(mode="json", by_alias=True, exclude_none=True)
        out.update({k: learner[k] for k in ("nodeSelector", "tolerations", "affinity") if learner.get(k)})
        if spec.learner.pod.image_pull_secrets:
            out["imagePullSecrets"] = [{"name": n} for n in spec.learner.pod.image_pull_secrets]
        return out
    if role not in (C.ROLE_ROLLOUT, C.ROLE_LEARNER):
        return out
    pod = getattr(spec, role).pod
    d = pod.model_dump(mode="json", by_alias=True, exclude_none=True)
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName", "runtimeClassName",
                "env", "volumes", "volumeMounts"):
        if d.get(key):
            out[key] = d[key]
    if pod.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": n} for n in pod.image_pull_secrets]
    return out


def _template_meta(run: RunRef, spec: RLRunSpec, role: str) -> dict[str, Any]:
    """Pod template labels and annotations: the role's extras under the operator's own."""
    gang = {C.LABEL_POD_GROUP: names(run.name)[C.ROLE_GANG]} if spec.scheduling.pod_group else {}
    meta: dict[str, Any] = {"labels": {**_role_extra(spec, role, "labels"), **gang, **labels(run.name, role)}}
    ann = _role_extra(spec, role, "annotations")
    if ann:
        meta["annotations"] = ann
    return meta


def _role_extra(spec: RLRunSpec, role: str, what: str) -> dict[str, str]:
    if role not in (C.ROLE_ROLLOUT, C.ROLE_LEARNER):
        return {}
    return dict(getattr(getattr(spec, role).pod, what))


def _ports(*pairs: tuple[str, int]) -> list[dict[str, Any]]:
    return [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in pairs]


def learner_grace_seconds(spec: RLRunSpec, world: int) -> int:
    """Seconds a rank gets between SIGTERM and SIGKILL: enough to finish the step under way
    and write a checkpoint. The checkpoint is each rank's share of weights plus fp32 master
    weights and two Adam moments (12 bytes a parameter), written at a conservative 100 MB/s,
    twice over for slow shared volumes, plus a minute for the step; at least 90 s. Fixed when
    the run starts: a new value in the pod template would restart every rank."""
    shape = model_shape_for(spec.model)
    share = (shape.weight_bytes(spec.model.dtype) + 12 * shape.params) / max(1, world if spec.learner.zero_stage else 1)
    return int(max(90, 60 + 2 * share / 100e6))


def build_ray_head(run: RunRef, spec: RLRunSpec, images: Images, finished: bool = False,
                   admitted: dict[str, int] | None = None, draining: int | None = None) -> dict[str, Any]:
    """The run's Ray head: a one-pod Deployment (CPU only) that stays up while the run is
    suspended and goes to zero once the run has ended."""
    n = names(run.name)
    pod = _pod_spec(
        run, spec, C.ROLE_RAY_HEAD, spec.learner.image or images.trainer,
        ["rlscale", "ray-head", "--config", C.CONFIG_PATH], _env(run, spec),
        {"requests": {"cpu": "100m", "memory": "1Gi"}},
        # What the head serves (no dashboard, no Serve HTTP proxy): GCS and Ray Client.
        _ports(("gcs", C.RAY_GCS_PORT), ("client", C.RAY_CLIENT_PORT)),
    )
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": object_meta(run, n[C.ROLE_RAY_HEAD], C.ROLE_RAY_HEAD),
        "spec": {
            "replicas": desired_replicas(spec, None, finished, admitted, draining)[C.ROLE_RAY_HEAD],
            # Never two heads of one run: the old one goes before its replacement starts.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {C.LABEL_RUN: run.name, C.LABEL_ROLE: C.ROLE_RAY_HEAD}},
            "template": {"metadata": _template_meta(run, spec, C.ROLE_RAY_HEAD), "spec": pod},
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
    env = _env(run, spec, [{"name": "RAY_ADDRESS",
                            "value": f"{n[C.ROLE_RAY_HEAD]}.{run.namespace}.svc:{C.RAY_GCS_PORT}"},
                           # How long the pod's Ray node drains on SIGTERM (constants.ROLLOUT_DRAIN_S).
                           {"name": "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "value": str(C.ROLLOUT_DRAIN_S)}])
    # Replicas load the model from the path rank 0 names: the shared volume read-only, or
    # (no volume named) a copy this pod prepares itself.
    shared = spec.model.volume is not None
    # No preStop hook: the process that needs time on a stop, the pod's Ray node, takes SIGTERM itself
    # and drains its replica (a pod the operator removes after a scale-down hosts none: it exits at once).
    pod = _pod_spec(run, spec, C.ROLE_ROLLOUT, spec.rollout.image or images.rollout,
                    ["rlscale", "rollout", "--config", C.CONFIG_PATH], env,
                    _resources(spec.rollout, gpu), _ports(("metrics", C.METRICS_PORT)),
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
            "template": {"metadata": _template_meta(run, spec, C.ROLE_ROLLOUT), "spec": pod},
        },
    }


def build_learner_statefulset(run: RunRef, spec: RLRunSpec, plan: Plan, images: Images,
                              finished: bool = False, admitted: dict[str, int] | None = None) -> dict[str, Any]:
    """DeepSpeed ranks: RANK from the pod ordinal, rank 0 is MASTER_ADDR, the driver and a Ray node."""
    n = names(run.name)
    gpu = spec.hardware.accelerator != "cpu"
    world = plan.learner_replicas
    master = f"{n[C.ROLE_LEARNER]}-0.{n[C.ROLE_LEARNER]}.{run.namespace}.svc"
    env = _env(run, spec, [
        {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{C.LABEL_POD_INDEX}']"}}},
        {"name": "LOCAL_RANK", "value": "0"},
        # WORLD_SIZE is the planned rank count; a change rolls the ranks, which resume from checkpoint.
        {"name": "WORLD_SIZE", "value": str(world)},
        {"name": "MASTER_ADDR", "value": master},
        {"name": "MASTER_PORT", "value": str(C.MASTER_PORT)},
        {"name": "RAY_ADDRESS", "value": f"{n[C.ROLE_RAY_HEAD]}.{run.namespace}.svc:{C.RAY_GCS_PORT}"},
    ])
    vols, mounts, claims = [], [{"name": "checkpoints", "mountPath": spec.checkpoint.path}], []
    if spec.checkpoint.volume:
        # The volume the spec names: shared by every rank (and kept with the run's report).
        vols = [{"name": "checkpoints", **copy.deepcopy(spec.checkpoint.volume)}]
    elif images.checkpoint_storage:
        # Claims from the template survive scale-to-zero, so suspend keeps the checkpoints.
        claims = [{"metadata": {"name": "checkpoints"},
                   "spec": {"accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": images.checkpoint_storage}}}}]
    else:
        vols = [{"name": "checkpoints", "emptyDir": {}}]
    if spec.task.plugin_volume:
        # The reward plug-ins' files, read-only; rank 0's reward loader searches them first.
        vols.append({"name": "plugins", **copy.deepcopy(spec.task.plugin_volume)})
        mounts.append({"name": "plugins", "mountPath": C.PLUGINS_MOUNT, "readOnly": True})
        env.append({"name": C.PLUGINS_ENV, "value": C.PLUGINS_MOUNT})
    pod = _pod_spec(run, spec, C.ROLE_LEARNER, spec.learner.image or images.trainer,
                    ["rlscale", "learner", "--config", C.CONFIG_PATH], env,
                    _resources(spec.learner, gpu), _ports(("master", C.MASTER_PORT), ("metrics", C.METRICS_PORT)),
                    vols, mounts, model="rw", init_model=True, token=True,
                    grace_seconds=learner_grace_seconds(spec, world))
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
            "template": {"metadata": _template_meta(run, spec, C.ROLE_LEARNER), "spec": pod},
        },
    }
    if claims:
        sts["spec"]["volumeClaimTemplates"] = claims
        sts["spec"]["persistentVolumeClaimRetentionPolicy"] = {"whenScaled": "Retain", "whenDeleted": "Delete"}
    return sts


def build_learner_service(run: RunRef) -> dict[str, Any]:
    """Headless: gives each rank a stable DNS name (rank 0 is MASTER_ADDR)."""
    n = names(run.name)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": object_meta(run, n[C.ROLE_LEARNER], C.ROLE_LEARNER),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": labels(run.name, C.ROLE_LEARNER),
                     "ports": [{"name": "master", "port": C.MASTER_PORT, "targetPort": C.MASTER_PORT}]}}


def build_metrics_service(run: RunRef) -> dict[str, Any]:
    """One Service over every pod of the run, port `metrics`, for ServiceMonitor scraping."""
    n = names(run.name)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": object_meta(run, n[C.ROLE_METRICS], C.ROLE_METRICS),
            # Pods are scraped whether or not they are Ready (a replica still loading, a rank rejoining).
            "spec": {"selector": {C.LABEL_RUN: run.name}, "publishNotReadyAddresses": True,
                     "ports": [{"name": "metrics", "port": C.METRICS_PORT, "targetPort": "metrics"}]}}


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
    desired_replicas."""
    images = images or Images()
    return [
        build_configmap(run, spec, plan),
        *build_runner_account(run),
        *([build_network_policy(run, images.metrics_from)] if images.network_policy else []),
        build_ray_head_service(run),
        build_learner_service(run),
        build_metrics_service(run),
        *build_disruption_budgets(run, spec, finished),
        # Before any pod that names it.
        *([build_pod_group(run, spec, plan)] if spec.scheduling.pod_group else []),
        build_ray_head(run, spec, images, finished, admitted, draining),
        build_rollout_deployment(run, spec, plan, images, finished, admitted, draining),
        build_learner_statefulset(run, spec, plan, images, finished, admitted),
    ]


# How long the Coscheduling plugin holds a partly placed group before it gives the nodes back
# and retries.
POD_GROUP_TIMEOUT_S = 300


def build_pod_group(run: RunRef, spec: RLRunSpec, plan: Plan) -> dict[str, Any]:
    """The Coscheduling PodGroup every pod of the run belongs to (the label in
    _template_meta): minMember is the planned pod count, so the scheduler binds all of them or
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
    pod_sets = [{"name": role, "count": counts[role], "template": copy.deepcopy(templates[role])}
                for role in QUEUED_ROLES]
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
