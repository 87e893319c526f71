"""The learner StatefulSet's pods: G DeepSpeed ranks a pod, and the colocated rollout slot.

One pod per node, G = the spec's learner ranks per pod (learner.ranksPerReplica; one per GPU by
default, one on cpu). With G = 1 a pod is one rank, as before: RANK is the pod's index. With G > 1
the pod's `rlscale learner` is a launcher (trainer/launcher.py) that starts G ranks with RANK =
NODE_RANK x G + LOCAL_RANK; the pod carries NODE_RANK (its index), LOCAL_WORLD_SIZE = G and
WORLD_SIZE = pods x G. MASTER_ADDR is pod 0 (its local rank 0 is rank 0) in both cases. The pod's
GPU request is learner.gpusPerReplica, which a spec rule makes equal to G on GPU accelerators.

Colocated (plan.placement "colocated"): there are no rollout pods; each learner pod's Ray node
offers one `rollout` slot (RAY_RESOURCES_ENV), so Serve places one replica on every learner pod, and
the replica shares the pod's GPUs and memory with the ranks: spec.learner.resources must cover both
(docs/operations.md). The replica answers its own /metrics on a second port of the pod.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from rlscale.plan import Plan, model_shape_for
from rlscale.roles import ROLLOUT_RESOURCE
from rlscale.spec import RLRunSpec

from . import constants as C
from .naming import RunRef, names
from .pods import container_ports, pod_spec, role_env, role_resources
from .tool_pods import tool_env

# The learner entrypoint's variable naming the Ray resources of the pod's node (JSON);
# rlscale.trainer.entrypoint.RAY_RESOURCES_ENV reads it (the operator does not import the trainer).
RAY_RESOURCES_ENV = "RLSCALE_RAY_RESOURCES"
# A colocated rollout replica's /metrics and /ready on a learner pod (its own port: local rank 0
# serves the pod's METRICS_PORT, local ranks > 0 answer on loopback at METRICS_PORT + 100 + r).
COLOCATED_ROLLOUT_METRICS_PORT = C.METRICS_PORT + 1


def ranks_per_pod(spec: RLRunSpec) -> int:
    """G: DeepSpeed ranks in one learner pod."""
    g = getattr(spec, "learner_ranks_per_pod", None)
    if isinstance(g, int):
        return g
    explicit = getattr(spec.learner, "ranks_per_replica", None)
    if explicit:
        return int(explicit)
    return 1 if spec.hardware.accelerator == "cpu" else max(1, spec.learner.gpus_per_replica)


def learner_world_size(spec: RLRunSpec, plan: Plan) -> int:
    """Ranks in the gang: the plan's learner pods x ranks a pod."""
    return plan.learner_replicas * ranks_per_pod(spec)


def colocated(plan: Plan | None) -> bool:
    """The plan puts the rollout engines on the learner pods (no rollout Deployment)."""
    return getattr(plan, "placement", "disaggregated") == "colocated"


def learner_grace_seconds(spec: RLRunSpec, world: int) -> int:
    """Seconds a pod's ranks get between SIGTERM and SIGKILL: enough to finish the step under way
    and write a checkpoint. The checkpoint is the pod's share of weights plus fp32 master weights
    and two Adam moments (12 bytes a parameter), written at a conservative 100 MB/s, twice over
    for slow shared volumes, plus a minute for the step; at least 90 s. `world`: the learner pods
    (a pod of G ranks writes G shares through one volume, so the pod's share is what counts).
    Fixed when the run starts: a new value in the pod template would restart every rank."""
    shape = model_shape_for(spec.model)
    share = (shape.weight_bytes(spec.model.dtype) + 12 * shape.params) / max(1, world if spec.learner.zero_stage else 1)
    return int(max(90, 60 + 2 * share / 100e6))


def _rank_env(run: RunRef, spec: RLRunSpec, plan: Plan) -> list[dict[str, Any]]:
    n = names(run.name)
    g = ranks_per_pod(spec)
    index = {"fieldRef": {"fieldPath": f"metadata.labels['{C.LABEL_POD_INDEX}']"}}
    # One rank a pod: the pod is the rank. Several: the pod's launcher numbers them.
    ranks = ([{"name": "RANK", "valueFrom": index}, {"name": "LOCAL_RANK", "value": "0"}] if g == 1
             else [{"name": "NODE_RANK", "valueFrom": index}])
    env = [
        *ranks,
        {"name": "LOCAL_WORLD_SIZE", "value": str(g)},
        # WORLD_SIZE is the planned rank count; a change rolls the ranks, which resume from checkpoint.
        {"name": "WORLD_SIZE", "value": str(learner_world_size(spec, plan))},
        {"name": "MASTER_ADDR", "value": f"{n[C.ROLE_LEARNER]}-0.{n[C.ROLE_LEARNER]}.{run.namespace}.svc"},
        {"name": "MASTER_PORT", "value": str(C.MASTER_PORT)},
        {"name": "RAY_ADDRESS", "value": f"{n[C.ROLE_RAY_HEAD]}.{run.namespace}.svc:{C.RAY_GCS_PORT}"},
    ]
    if colocated(plan):
        env.append({"name": RAY_RESOURCES_ENV, "value": json.dumps({ROLLOUT_RESOURCE: 1})})
    return env + tool_env(run, spec)


def _checkpoint_volumes(spec: RLRunSpec, storage: str) -> tuple[list, list, list]:
    """(volumes, mounts, claim templates) of the ranks' checkpoint directory."""
    vols, mounts, claims = [], [{"name": "checkpoints", "mountPath": spec.checkpoint.path}], []
    if spec.checkpoint.volume:
        # The volume the spec names: shared by every rank (and kept with the run's report).
        vols = [{"name": "checkpoints", **copy.deepcopy(spec.checkpoint.volume)}]
    elif storage:
        # Claims from the template survive scale-to-zero, so suspend keeps the checkpoints.
        claims = [{"metadata": {"name": "checkpoints"},
                   "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": storage}}}}]
    else:
        vols = [{"name": "checkpoints", "emptyDir": {}}]
    return vols, mounts, claims


def learner_pod(run: RunRef, spec: RLRunSpec, plan: Plan, image: str,
                checkpoint_storage: str = "") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The learner pod template's spec and the StatefulSet's claim templates."""
    gpu = spec.hardware.accelerator != "cpu"
    env = role_env(run, spec, _rank_env(run, spec, plan))
    vols, mounts, claims = _checkpoint_volumes(spec, checkpoint_storage)
    if spec.task.plugin_volume:
        # The reward plug-ins' files, read-only; rank 0's reward loader searches them first.
        vols.append({"name": "plugins", **copy.deepcopy(spec.task.plugin_volume)})
        mounts.append({"name": "plugins", "mountPath": C.PLUGINS_MOUNT, "readOnly": True})
        env.append({"name": C.PLUGINS_ENV, "value": C.PLUGINS_MOUNT})
    ports = [("master", C.MASTER_PORT), ("metrics", C.METRICS_PORT)]
    if colocated(plan):
        ports.append(("rollout-metrics", COLOCATED_ROLLOUT_METRICS_PORT))
    pod = pod_spec(run, spec, C.ROLE_LEARNER, image, ["rlscale", "learner", "--config", C.CONFIG_PATH], env,
                   role_resources(spec.learner, gpu), container_ports(*ports),
                   vols, mounts, model="rw", init_model=True, token=True,
                   grace_seconds=learner_grace_seconds(spec, plan.learner_replicas))
    return pod, claims
