"""`rlscale run` with generation ahead of training (spec.algorithm.maxStaleness > 0): the rollout and
the learner get disjoint CPU cores, so that running them at once is overlap and not two pools of
threads taking turns on the same cores.

The cores split in proportion to the predicted generate (+ reward) and train seconds on every core, each
side at least one core: the overlapped step is the longer of the two, and this split evens them out. With
one core there is nothing to split (None). The planner predicts each side on its share (SystemModel.phases_at)
and the run takes the split the plan predicted (Prediction.cores): the cores split only when the plan
generates ahead, since the synchronous loop runs each phase fastest on every core."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class CoreSplit:
    rollout: list[int]  # CPU ids of the Ray head and the rollout processes (and their engines' threads)
    learner: list[int]  # CPU ids of the learner processes

    def describe(self, generate_s: float, train_s: float) -> str:
        """"cores: rollout 0 (1), learner 1 (1); predicted on them: generate 0.41 s, train 0.57 s"."""
        return (f"cores: rollout {_ids(self.rollout)} ({len(self.rollout)}), learner {_ids(self.learner)} "
                f"({len(self.learner)}); predicted on them: generate {generate_s:.2f} s, train {train_s:.2f} s")


def _ids(cpus: list[int]) -> str:
    return ",".join(map(str, cpus))


def split_cores(cpus: list[int], generate_s: float, train_s: float) -> CoreSplit | None:
    """The rollout's share: round(cores x generate / (generate + train)), within [1, cores - 1]."""
    cpus = sorted(cpus)
    if len(cpus) < 2:
        return None
    total = max(generate_s, 0.0) + max(train_s, 0.0)
    share = 0.5 if total <= 0 else max(generate_s, 0.0) / total
    n = min(len(cpus) - 1, max(1, round(len(cpus) * share)))
    return CoreSplit(cpus[:n], cpus[n:])


def available_cpus() -> list[int]:
    """The CPUs this process may run on."""
    return sorted(os.sched_getaffinity(0))
