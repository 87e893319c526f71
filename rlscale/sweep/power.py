"""What a sweep could see: the eval's noise against the rise from the start to the level, and the
smallest samples-to-level ratio its seeds could detect (docs/planner.md, section 5). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlscale.sweep.analysis import BatchStats, RunData
from rlscale.sweep.stats import (
    BOOTSTRAP_DRAWS,
    BOOTSTRAP_SEED,
    LEVEL_MIN_SDS,
    eval_scatter,
    minimum_detectable_ratio,
    proportion_sd,
    seed_sd,
)

# builtin:arithmetic holds out min(500, problems / 5) prompts (a fixed split of each level's problems);
# level 0 has 100 problems, the others thousands.
BUILTIN_EVAL_PROMPTS = 500
BUILTIN_SMALL_LEVELS = {0: 20}


def eval_prompts(spec: Any) -> int | None:
    """Held-out prompts of one eval when the spec says: task.evalSize, else the builtin task's split;
    None for a dataset without evalSize (its size is in the rows, which the report does not read)."""
    task = spec.task
    size = getattr(task, "eval_size", None)
    builtin = getattr(task, "name", None) == "builtin:arithmetic" and not getattr(task, "dataset", None)
    if builtin:
        n = BUILTIN_SMALL_LEVELS.get(int(getattr(task, "difficulty", 1) or 0), BUILTIN_EVAL_PROMPTS)
        return min(n, size) if size else n
    return int(size) if size else None


@dataclass(frozen=True)
class Power:
    seeds: int
    sd_log: float | None  # pooled seed-to-seed sd of log samples-to-level
    detectable: float | None  # the smallest ratio of samples-to-level detectable (80% power, 5% two-sided)
    eval_sd: float | None
    eval_sd_from: str
    start: float | None  # the highest value before training over the runs
    level: float | None
    warning: str | None = None

    @property
    def rise(self) -> float | None:
        return self.level - self.start if self.level is not None and self.start is not None else None


def power(spec: Any, runs: list[RunData], cells: list[BatchStats], level: float | None) -> Power:
    """The sweep's power from its runs: seed scatter, eval noise, and the level's distance from the start."""
    seeds = len({r.seed for r in runs})
    sd_log = seed_sd([list(c.seed_samples.values()) for c in cells])
    starts = [v for r in runs if (v := r.start_value()) is not None]
    start = max(starts) if starts else None
    n = eval_prompts(spec)
    if n is not None and level is not None and 0.0 <= level <= 1.0:
        ps = [level] + ([start] if start is not None and 0.0 <= start <= 1.0 else [])
        eval_sd = max(proportion_sd(p, n) for p in ps)
        source = f"sqrt(p (1 - p) / n) over n = {n} held-out prompts, at the larger of the start's and the level's p"
    else:
        eval_sd = eval_scatter([[p.value for p in r.evals() if p.samples > 0] for r in runs])
        source = "the scatter of successive evals in the runs"
    warning = None
    if eval_sd and level is not None and start is not None and level - start < LEVEL_MIN_SDS * eval_sd:
        warning = (f"the level {level:.2f} is only {(level - start) / eval_sd:.1f} eval standard deviations "
                   f"({eval_sd:.3f}) above the start {start:.3f}, below {LEVEL_MIN_SDS:g}: samples-to-level measures "
                   "the eval's noise more than learning; raise --samples so the runs climb further, or evaluate more "
                   "held-out prompts (task.evalSize)")
    return Power(seeds, sd_log, minimum_detectable_ratio(sd_log, seeds), eval_sd, source, start, level, warning)


def power_lines(pw: Power, tol: float) -> list[str]:
    """sweep.md's section on what the sweep could see."""
    lines = ["", "## Power", ""]
    lines.append(f"Intervals: {BOOTSTRAP_DRAWS:,} draws of the {pw.seeds} seed(s) with replacement, 95% percentile "
                 f"intervals, random seed {BOOTSTRAP_SEED} (the same runs give the same report). A verdict whose "
                 "interval straddles its threshold is inconclusive."
                 + (" With one seed every interval is a single value: no verdict here has an error bar."
                    if pw.seeds < 2 else ""))
    if pw.detectable is not None:
        lines.append(f"Seed-to-seed scatter of samples-to-level: sd {pw.sd_log:.1%} (pooled, log scale). With "
                     f"{pw.seeds} seeds per cell the smallest ratio of samples-to-level this sweep detects 80% of the "
                     f"time (5% two-sided) is x{pw.detectable:.2f}, against the x{1 + tol:.2f} band used for 'the "
                     "same'" + (": smaller differences pass for none." if pw.detectable > 1 + tol else "."))
    else:
        lines.append("Seed-to-seed scatter: not measured (a cell needs two seeds that reach the level).")
    if pw.eval_sd is not None and pw.rise is not None:
        lines.append(f"One eval's standard deviation: {pw.eval_sd:.3f} ({pw.eval_sd_from}); the rise from the start "
                     f"{pw.start:.3f} to the level {pw.level:.2f} is {pw.rise:.3f}, {pw.rise / pw.eval_sd:.1f} of "
                     "them.")
    return lines
