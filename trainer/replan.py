"""Re-planning between steps: which measured or predicted configuration to switch to, and when."""

from __future__ import annotations

from typing import Any

import numpy as np

REPLAN_WARMUP_STEPS = 10  # first steps carry one-off costs (first logprobs call, compiles)
REPLAN_EVERY = 25
REPLAN_MIN_GAIN = 0.15  # switch only when the new choice is predicted 15% faster ...
REPLAN_CONFIRM = 2  # ... at this many re-plans in a row: one noisy window does not move the batch
NOISE_WINDOW = 100  # steps whose noise estimates are averaged: one step's are very noisy


def measured_throughput(records: list[dict], min_steps: int = 10, last: int = 50) -> dict[tuple[int, int], float]:
    """Median samples/s per (prompts, rollout replicas) over the last steps run with it."""
    by: dict[tuple[int, int], list[float]] = {}
    for r in records:
        by.setdefault((r["prompts"], r["rollout_replicas"]), []).append(r["samples_per_second"])
    return {k: float(np.median(v[-last:])) for k, v in by.items() if len(v) >= min_steps}


class ReplanGate:
    """Lets a change through only when `confirm` re-plans in a row propose the same one.

    One re-plan sees a short, noisy window (a stalled neighbour, a lucky noise estimate);
    a change that survives two windows is worth the disruption of switching.
    """

    def __init__(self, confirm: int = 2):
        self.confirm = max(1, confirm)
        self.key: Any = None
        self.count = 0

    def propose(self, key: Any) -> bool:
        """Record this re-plan's proposal (None: keep the current configuration); True to apply it now."""
        if key is None:
            self.key, self.count = None, 0
            return False
        self.count = self.count + 1 if key == self.key else 1
        self.key = key
        if self.count >= self.confirm:
            self.key, self.count = None, 0
            return True
        return False


def find_config(cands: list[dict], key: tuple[int, int]) -> dict | None:
    """The candidate with (prompts, rollout replicas) == key, if the planner listed it."""
    return next((c for c in cands if (c["prompts"], c["rolloutReplicas"]) == key), None)


def choose_config(cands: list[dict], measured: dict[tuple[int, int], float],
                  current: tuple[int, int]) -> tuple[dict, float, float]:
    """(best candidate, its seconds to target, the current one's): measured samples/s where a
    configuration has run, the calibrated model elsewhere.

    A model calibrated at one point is least trustworthy far from it; judging tried
    configurations by what they did keeps the batch from going back and forth.
    """
    def seconds(c: dict) -> float:
        sps = measured.get((c["prompts"], c["rolloutReplicas"]))
        if not sps:
            return c["predicted"]["timeToTargetSeconds"]
        e, pred = c["predicted"]["samplesToTarget"], c["predicted"]
        # The run's clock also counts its evals: the same seconds per step at any batch.
        return e / sps + e / c.get("batch", 1) * pred.get("evalSecondsPerStep", 0.0)

    best = min(cands, key=seconds)
    cur = find_config(cands, current)
    return best, seconds(best), seconds(cur) if cur else float("inf")
