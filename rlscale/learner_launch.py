"""How `rlscale run` starts the learners (rlscale/embedded.py): the environment of each learner
process, numbered as the operator numbers a run's learner pods (operator/learner_pods.py): a process
a rank, or a launcher a replica of several ranks (trainer/launcher.py); colocated, each one's Ray node
offers the replica's rollout slot."""

from __future__ import annotations

import os
from typing import Any

# The learner entrypoint's variable naming the Ray resources its node offers (a colocated run's
# rollout slot); rlscale.trainer.entrypoint.RAY_RESOURCES_ENV (the core does not import the trainer).
RAY_RESOURCES_ENV = "RLSCALE_RAY_RESOURCES"
COLOCATED_SLOT = '{"rollout": 1}'


def colocated(plan: Any) -> bool:
    """The plan puts the rollout engines on the learners: no rollout processes are started."""
    return getattr(plan, "placement", "disaggregated") == "colocated"


def learner_launches(replicas: int, ranks: int, master_port: str, colocate: bool = False,
                     gpus: list[str] | None = None) -> list[dict[str, str]]:
    """The environment of each learner process the runner starts, as the operator's pods get it: one
    rank a process (`ranks` 1: RANK, LOCAL_RANK = RANK, the rank's GPU), else one launcher a replica
    (trainer/launcher.py: NODE_RANK, LOCAL_WORLD_SIZE; it numbers its ranks), each with its own
    GPUs (`gpus`: CUDA_VISIBLE_DEVICES, ranks of them a launcher) where there are GPUs. `colocate`:
    each process's Ray node (the first rank's of a replica) offers the replica's rollout slot."""
    out = []
    for i in range(replicas):
        env = {"WORLD_SIZE": str(replicas * ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": master_port,
               "LOCAL_WORLD_SIZE": str(ranks), "NODE_RANK": str(i)}
        if ranks == 1:
            env.update(RANK=str(i), LOCAL_RANK=str(i))
        elif gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[i * ranks:(i + 1) * ranks])
        if colocate:
            env[RAY_RESOURCES_ENV] = COLOCATED_SLOT
        out.append(env)
    return out


def local_gpus(spec, n: int) -> list[str] | None:
    """The `n` GPUs the launchers split among themselves (of CUDA_VISIBLE_DEVICES, else 0..n-1);
    None on cpu."""
    if spec.hardware.accelerator == "cpu":
        return None
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    return (visible or [str(k) for k in range(n)])[:n]
