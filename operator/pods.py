"""Pod templates shared by the run's workloads (operator/builders.py, operator/learner_pods.py): the
environment every role reads, resources, volumes, security contexts and the spec's pod overrides.
Pure, like the builders."""

from __future__ import annotations

import copy
from typing import Any

from rlscale.plan.placement import TRANSFER_BUCKET_BYTES, ranks_per_pod
from rlscale.spec import RLRunSpec

from . import constants as C
from .availability import readiness_probe
from .naming import RunRef, labels, names


def object_store_bytes(spec: RLRunSpec) -> int:
    """Ray object store per node: requests, samples and reward batches. Weights never pass through it (they move
    through vLLM's weight transfer engines), so it does not grow with the model."""
    return 512 * 2**20


def shm_size(spec: RLRunSpec) -> str:
    """The memory-backed /dev/shm: the object store, one transfer bucket per learner rank of the pod (the shm
    backend's segments on a cpu node; ipc keeps its buckets in GPU memory), and room for torch's shared memory."""
    buckets = ranks_per_pod(spec) * TRANSFER_BUCKET_BYTES if spec.hardware.accelerator == "cpu" else 0
    return f"{(object_store_bytes(spec) + buckets + 512 * 2**20) // 2**20}Mi"


def role_resources(role_spec: Any, gpu: bool) -> dict[str, Any]:
    """The spec's resources plus the GPU request (a GPU request must equal its limit)."""
    res = copy.deepcopy(role_spec.resources) if role_spec.resources else {}
    if gpu and role_spec.gpus_per_replica > 0:
        n = str(role_spec.gpus_per_replica)
        res.setdefault("limits", {})[C.GPU_RESOURCE] = n
        res.setdefault("requests", {})[C.GPU_RESOURCE] = n
    return res


def role_env(run: RunRef, spec: RLRunSpec, extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
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


def _model_volume(spec: RLRunSpec) -> dict[str, Any]:
    """The volume the spec names for the model, else an emptyDir each pod fills itself."""
    return {"name": "model", **(copy.deepcopy(spec.model.volume) if spec.model.volume else {"emptyDir": {}})}


# The `restricted` Pod Security profile: the images run as uid 1000 (images/torch), write
# only to HOME and /tmp (emptyDirs below) and need no capability.
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": C.RUN_AS_USER, "runAsGroup": C.RUN_AS_USER,
                "fsGroup": C.RUN_AS_USER, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                      "capabilities": {"drop": ["ALL"]}}


NO_GPUS = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}


def _container(name: str, image: str, command: list[str], env: list[dict[str, Any]],
               mounts: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {"name": name, "image": image, "command": command, "env": env, **more, "volumeMounts": mounts,
            "securityContext": copy.deepcopy(CONTAINER_SECURITY),
            # A container that dies leaves its last log lines in its status: the operator's
            # Degraded and Failed conditions quote them.
            "terminationMessagePolicy": "FallbackToLogsOnError"}


def pod_spec(run: RunRef, spec: RLRunSpec, role: str, image: str, command: list[str], env: list[dict[str, Any]],
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
    if not int((resources.get("limits") or {}).get(C.GPU_RESOURCE) or 0):
        # With the NVIDIA container toolkit's default settings, a container that asks for no GPU but runs an
        # image that sets NVIDIA_VISIBLE_DEVICES (CUDA images do) sees every GPU of its node.
        env.append(NO_GPUS)
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
        # It asks for no GPU, whatever its pod's main container does.
        init_env = [*env, NO_GPUS] if NO_GPUS not in env else env
        pod["initContainers"] = [_container("model", image, ["rlscale", "prepare-model", "--config", C.CONFIG_PATH],
                                            init_env, init_mounts)]
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


def template_meta(run: RunRef, spec: RLRunSpec, role: str) -> dict[str, Any]:
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


def container_ports(*pairs: tuple[str, int]) -> list[dict[str, Any]]:
    return [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in pairs]
