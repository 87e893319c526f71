"""The learning-rate schedule (spec.optimizer.lrSchedule): a multiplier of the planned peak lr.

`steps` is the number of learner steps already trained (Learner.steps: a batch the learner skipped, every group
scored alike, does not count), so the schedule's position is whatever a checkpoint restored. The multiplier:

- warm-up, while steps < warmup: (steps + 1) / warmup, linear up to 1 (the first step trains at 1/warmup of the
  peak, not 0);
- then, over decay = decaySteps (unset: budget.maxSteps) steps counted from 0, progress p = (steps - warmup) /
  (decay - warmup), capped at 1:
  - constant: 1;
  - linear: 1 - p, TRL's (transformers') `linear`, which reaches 0 at `decay` steps;
  - cosine: (1 + cos(pi p)) / 2, TRL's `cosine` (half a cycle), 0 at `decay` steps.

The multiplier scales the lr the planner gives (the sqrt rule's lr for the planned batch), so a re-planned batch
moves the peak and keeps the schedule's position. Pure Python: the spec's checks and tests import it without torch.
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(steps: int, schedule: str = "constant", warmup: int = 0, decay: int | None = None) -> float:
    """The multiplier of the peak lr for the learner step after `steps` trained ones."""
    if schedule not in SCHEDULES:
        raise ValueError(f"spec.optimizer.lrSchedule: {schedule!r} is not known; use one of {', '.join(SCHEDULES)}")
    if warmup and steps < warmup:
        return (steps + 1) / warmup
    if schedule == "constant":
        return 1.0
    if decay is None or decay <= warmup:
        raise ValueError(f"spec.optimizer.decaySteps: {decay} must exceed optimizer.warmupSteps ({warmup}) for "
                         f"lrSchedule {schedule}; raise decaySteps (or budget.maxSteps)")
    p = min(1.0, (steps - warmup) / (decay - warmup))
    return 1.0 - p if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))
