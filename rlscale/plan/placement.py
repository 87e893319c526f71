"""Placement: where the rollout engines run (colocated on the learner GPUs, or disaggregated on their own),
how new weights reach them, and the words that say why the plan chose one (docs/planner.md, section 1).

The formulas here are pure functions of numbers; throughput.py calls them for the sync phase and the
decision calls the spec-facing helpers to build one throughput model per placement.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

# A colocated engine's share of each GPU while awake (colocated examples of verl and OpenRLHF set vLLM to
# about 0.4-0.6); the learner's states are offloaded meanwhile, so the memory check allows more.
COLOCATED_MEMORY_UTILIZATION = 0.5
# Waking a sleeping engine: its weight and KV cache memory re-allocated, the block tables rebuilt.
WAKE_KV_SECONDS = 0.1
# Each extra receiver of a pipelined broadcast adds one hop's start-up, not another copy of the weights.
BROADCAST_HOP_SECONDS = 0.005


# --------------------------------------------------------------------------- sync formulas


def broadcast_seconds(weight_bytes: float, bandwidth: float, latency: float, replicas: int) -> float:
    """Pipelined broadcast from learner rank 0: every byte crosses each link once, so the time is
    W / bandwidth whatever the replica count, plus a hop's start-up per extra replica."""
    return weight_bytes / bandwidth + latency + BROADCAST_HOP_SECONDS * max(0, replicas - 1)


def handover_seconds(weight_bytes: float, device_bandwidth: float) -> float:
    """New weights into an engine on the learner's own GPUs: a device-memory copy (read and write)."""
    return 2.0 * weight_bytes / device_bandwidth


# --------------------------------------------------------------------------- transfer backends

# How new weights reach the engines: vLLM's weight transfer engines on GPUs, and on the CPU the
# transports rlscale registers with vLLM's factory, which run the same four-phase protocol
# (init, start, update, finish) over another wire (rlscale.rollout.transfer).
TRANSFER_BACKENDS = {
    ("gpu", "disaggregated"): "nccl",  # a broadcast group: learner rank 0 -> every replica's workers
    ("gpu", "colocated"): "ipc",  # CUDA IPC handles on the same GPU (NCCL refuses two processes on one GPU)
    ("cpu", "disaggregated"): "gloo",  # the nccl stand-in: a chained gloo broadcast
    ("cpu", "colocated"): "shm",  # the ipc stand-in: a shared-memory bucket on the node
}


# The most a weight update holds at once on a receiver (a bucket of parameters, cut at layer boundaries), and
# what the shm stand-in keeps in /dev/shm per learner rank.
TRANSFER_BUCKET_BYTES = 512 * 2**20


def transfer_backend(accelerator: str, placement: str) -> str:
    """The weight transfer backend of a placement: nccl or ipc on a GPU, gloo or shm on cpu."""
    kind = "cpu" if accelerator == "cpu" else "gpu"
    if placement not in ("colocated", "disaggregated"):
        raise ValueError(f"placement {placement!r}: use colocated or disaggregated")
    return TRANSFER_BACKENDS[(kind, placement)]


# --------------------------------------------------------------------------- from the spec


def spec_placement(spec: Any) -> str:
    """spec.placement: auto, colocated or disaggregated."""
    return str(getattr(spec, "placement", "auto") or "auto")


def weight_sync_for(spec: Any) -> str:
    """spec.rollout.weightSync resolved: auto is broadcast."""
    method = str(getattr(spec.rollout, "weight_sync", "auto") or "auto")
    return "broadcast" if method == "auto" else method


def ranks_per_pod(spec: Any) -> int:
    """DeepSpeed ranks in one learner pod: learner.ranksPerReplica, else one per GPU (one on cpu)."""
    ranks = getattr(spec.learner, "ranks_per_replica", None)
    if ranks:
        return int(ranks)
    return 1 if spec.hardware.accelerator == "cpu" else max(1, spec.learner.gpus_per_replica)


def placements_for(spec: Any, placement: str | None = None) -> list[str]:
    """The placements to predict: the one asked for; on auto, both on a GPU accelerator when the rollout
    replica count is free (colocated ties it to the learner pods) and the learner image can run an engine
    (colocated_unavailable), disaggregated on cpu (as before)."""
    asked = placement or spec_placement(spec)
    if asked != "auto":
        return [asked]
    if spec.hardware.accelerator == "cpu" or spec.rollout.replicas != "auto" or colocated_unavailable(spec):
        return ["disaggregated"]
    return ["colocated", "disaggregated"]


def colocated_unavailable(spec: Any) -> str | None:
    """Why auto does not offer colocated on a GPU accelerator where it otherwise could: the engine runs in the
    learner pod, and the chart's default learner image carries vLLM, a custom spec.learner.image may not."""
    image = getattr(spec.learner, "image", None)
    if spec_placement(spec) != "auto" or spec.hardware.accelerator == "cpu" or not image:
        return None
    return (f"not offered: learner.image {image!r} is not the chart's default learner image, which carries vLLM "
            "for the engine a colocated pod runs; unset learner.image, or set placement: colocated if that image "
            "has vLLM")


def tensor_parallel(spec: Any, placement: str) -> int:
    """GPUs per engine: a colocated engine spans its learner pod's GPUs; 1 on cpu."""
    if spec.hardware.accelerator == "cpu":
        return 1
    gpus = spec.learner.gpus_per_replica if placement == "colocated" else spec.rollout.gpus_per_replica
    return max(1, int(gpus))


def rollout_utilization(spec: Any, placement: str, default: float) -> float:
    """The engine's share of each device's memory: rollout.gpuMemoryUtilization, else the profile's
    default disaggregated and COLOCATED_MEMORY_UTILIZATION colocated (on cpu the profile's either way)."""
    asked = getattr(spec.rollout, "gpu_memory_utilization", None)
    if asked:
        return float(asked)
    if placement == "colocated" and spec.hardware.accelerator != "cpu":
        lora = getattr(spec, "lora", None)
        if lora is not None and not lora.modules_to_save:
            from rlscale.plan.lora import COLOCATED_LORA_MEMORY_UTILIZATION

            return COLOCATED_LORA_MEMORY_UTILIZATION
        return COLOCATED_MEMORY_UTILIZATION
    return default


def layout_model(model: Any, spec: Any, placement: str) -> Any:
    """The throughput model of one placement: the engine's TP degree and memory share, the sync method."""
    return replace(model, placement=placement, weight_sync=weight_sync_for(spec),
                   rollout_gpus=tensor_parallel(spec, placement),
                   rollout_memory_utilization=rollout_utilization(spec, placement, model.profile.memory_utilization))


def splits_for(spec: Any, placement: str) -> list[tuple[int, int]]:
    """(rollout, learner) replica pairs within bounds and budget: colocated runs one engine per learner
    pod (rollout = learner) on the learner GPUs only; disaggregated adds the rollout GPUs."""
    ro, le = spec.rollout, spec.learner
    ls = [le.replicas] if le.replicas != "auto" else range(1, le.max_replicas + 1)
    cpu = spec.hardware.accelerator == "cpu"
    if placement == "colocated":
        ks = [k for k in ls if k <= ro.max_replicas and (ro.replicas == "auto" or ro.replicas == k)]
        return [(k, k) for k in ks if cpu or k * le.gpus_per_replica <= spec.budget.gpus]
    rs = [ro.replicas] if ro.replicas != "auto" else range(1, ro.max_replicas + 1)
    if cpu:
        return [(r, k) for r in rs for k in ls]
    return [(r, k) for r in rs for k in ls if r * ro.gpus_per_replica + k * le.gpus_per_replica <= spec.budget.gpus]


def gpus_for(spec: Any, placement: str, rollout: int, learner: int) -> int:
    """GPUs a split takes (0 on cpu): colocated engines add none."""
    if spec.hardware.accelerator == "cpu":
        return 0
    learners = learner * spec.learner.gpus_per_replica
    return learners if placement == "colocated" else learners + rollout * spec.rollout.gpus_per_replica


# --------------------------------------------------------------------------- the words


def placement_reason(spec: Any, win: Any, best: dict[str, Any], refused: dict[str, str],
                     same_batch: Any = None) -> str:
    """Why the winner's placement: asked for, the only one that fits (and why the other does not), or
    faster to target (by how much against the other's best, and the phases against the other placement
    at the winner's batch, `same_batch`, when it has that batch)."""
    p = win.placement
    if spec_placement(spec) != "auto":
        return f"{p}: set by spec.placement"
    other = "disaggregated" if p == "colocated" else "colocated"
    if other in refused:
        if refused[other].startswith("not "):
            return f"{p}: {other} {refused[other]}"
        return f"{p}: {other} does not fit ({refused[other]})"
    rival = best.get(other)
    if rival is None:
        if spec.hardware.accelerator == "cpu":
            return f"{p}: the cpu default (spec.placement: colocated runs one engine per learner process)"
        return f"{p}: rollout.replicas is fixed, so the engines cannot follow the learner pods"
    ratio = rival.predicted.time_to_target_seconds / win.predicted.time_to_target_seconds
    text = f"{p}: {ratio:.2f}x faster to target than {other} ({describe(win)}; {other}: {describe(rival)})"
    if same_batch is not None:
        a, b = win.predicted, same_batch.predicted
        text += (f"; at N={win.batch}, step {a.step_seconds:.2f} s vs {b.step_seconds:.2f} s: generate "
                 f"{a.generate:.2f} vs {b.generate:.2f}, train {a.train:.2f} vs {b.train:.2f}, "
                 f"sync {a.sync:.2f} vs {b.sync:.2f}")
    return text


def describe(c: Any) -> str:
    """One candidate's layout in words: replicas, GPUs, the engine's memory share, how weights travel."""
    gpus = f" on {c.gpus} GPUs" if c.gpus else ""
    share = f"the engine at {c.memory_utilization:.2g} of memory" if c.memory_utilization else "the engine"
    if c.placement == "colocated":
        return (f"{c.learner_replicas} learner pod(s) with {share}{gpus}, asleep while the learner trains, "
                "weights by CUDA IPC on each pod's GPUs")
    return (f"{c.rollout_replicas} rollout + {c.learner_replicas} learner replicas{gpus}, {share}, "
            "weights broadcast over the network")
