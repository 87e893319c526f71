"""Bounded staleness: the rollout generating up to K steps ahead of the learner (docs/planner.md,
sections 1-3). The step overlaps generation with training; each step of staleness costs samples.

Pure functions: the overlapped step time, the samples penalty, and the staleness values a plan may
take (reason.py words why the plan chose its staleness).
"""

from __future__ import annotations

from typing import Any

# Samples-to-target multiplier per step of staleness, p in (1 + p)^K, when no sweep measured it.
# An assumption, not a measurement: with it, one step of staleness is taken only where it buys more
# than 5% throughput. `rlscale sweep --staleness 0,1` measures p; the patch it writes carries it.
DEFAULT_STALENESS_PENALTY = 0.05

def overlapped_step(generate: float, reward: float, train: float, sync: float, staleness: int) -> float:
    """Seconds of one step: the sum at staleness 0 (generate, score, train, publish in turn); from 1 on,
    the next batch is generated and scored while the learner trains, and the weight hand-over cannot
    overlap: max(generate + reward, train) + sync. Held-out evals are added by the caller (no overlap)."""
    if staleness <= 0:
        return generate + reward + train + sync
    return max(generate + reward, train) + sync


def staleness_penalty(k: int, p: float) -> float:
    """Samples-to-target multiplier of staleness k: (1 + p)^k, each step of lag compounding."""
    return (1.0 + max(p, 0.0)) ** max(k, 0)


def max_staleness(spec: Any) -> int:
    """spec.algorithm.maxStaleness (0 on a spec without it)."""
    return int(getattr(spec.algorithm, "max_staleness", 0) or 0)


def staleness_options(spec: Any, placement: str, staleness: int | None = None) -> list[int]:
    """The staleness values a plan compares: 0 colocated (the engines sleep while the learner trains),
    else 0..maxStaleness, or only the pinned one (`staleness`: --staleness, a sweep's run) capped there."""
    top = max_staleness(spec)
    if placement == "colocated":
        return [0]
    if staleness is not None:
        return [min(max(int(staleness), 0), top)]
    return list(range(top + 1))


def penalty_for(calibration: Any) -> tuple[float, str]:
    """p and where it came from: a sweep's fit carried in the calibration, else the default."""
    if getattr(calibration, "has_staleness_penalty", False):
        return float(calibration.staleness_penalty), "measured by a sweep"
    return DEFAULT_STALENESS_PENALTY, "the default, not measured"
