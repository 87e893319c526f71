"""Uncertainty of a sweep's verdicts, torch-free: bootstrap intervals over seeds, and the smallest
effect a sweep of this size could see (docs/planner.md, section 5).

A seed is the unit that is resampled: every statistic is a function of a draw of seeds (with
repeats), and its 95% interval is the 2.5th..97.5th percentile over BOOTSTRAP_DRAWS draws from a
random.Random seeded with BOOTSTRAP_SEED, so the same runs give the same report.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from statistics import mean, median

BOOTSTRAP_DRAWS = 2000
BOOTSTRAP_SEED = 20250101
CI_LEVEL = 0.95
# z(0.975) + z(0.80): a two-sided 5% test that detects the effect 80% of the time.
Z_POWER = 1.959964 + 0.841621
# A level closer to the start than this many eval standard deviations measures the eval's noise.
LEVEL_MIN_SDS = 3.0

Interval = tuple[float, float]
BySeed = Mapping[int, float]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of sorted values, linearly interpolated."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bootstrap(seeds: Sequence[int], stat: Callable[[list[int]], float | None], draws: int = BOOTSTRAP_DRAWS,
              level: float = CI_LEVEL, rng_seed: int = BOOTSTRAP_SEED) -> Interval | None:
    """The percentile interval of stat over draws of len(seeds) seeds with replacement; None when no draw
    gives a finite value. With one seed the interval is that seed's value."""
    pool = sorted(set(seeds))
    if not pool:
        return None
    rng = random.Random(rng_seed)
    seen: dict[tuple[int, ...], float | None] = {}  # a draw's order does not matter: few seeds, few draws
    values = []
    for _ in range(draws):
        draw = tuple(sorted(rng.choice(pool) for _ in pool))
        if draw not in seen:
            seen[draw] = stat(list(draw))
        v = seen[draw]
        if v is not None and math.isfinite(v):
            values.append(v)
    if not values:
        return None
    values.sort()
    tail = (1.0 - level) / 2.0
    return percentile(values, tail), percentile(values, 1.0 - tail)


def draw_mean(by_seed: BySeed, draw: Sequence[int], how: Callable = mean) -> float | None:
    """The mean (or `how`) of the drawn seeds' values, repeats counted; seeds without a value left out."""
    vs = [by_seed[s] for s in draw if s in by_seed]
    return how(vs) if vs else None


def ratio_ci(top: BySeed, bottom: BySeed, how: Callable = mean) -> Interval | None:
    """Interval of how(top) / how(bottom) over seeds drawn together for both (a seed is one unit)."""
    seeds = sorted(set(top) | set(bottom))

    def stat(draw: list[int]) -> float | None:
        a, b = draw_mean(top, draw, how), draw_mean(bottom, draw, how)
        return a / b if a is not None and b else None

    return bootstrap(seeds, stat)


def ratio_point(top: BySeed, bottom: BySeed, how: Callable = mean) -> float | None:
    a, b = (how(list(d.values())) if d else None for d in (top, bottom))
    return a / b if a is not None and b else None


def side(ci: Interval | None, threshold: float, point: float | None = None) -> bool | None:
    """True when the interval lies above the threshold, False below, None when it straddles it. Without
    an interval, the point estimate decides."""
    if ci is None:
        return None if point is None else point > threshold
    lo, hi = ci
    if lo > threshold:
        return True
    if hi < threshold:
        return False
    return None


def within(ci: Interval | None, low: float, high: float, point: float | None = None) -> bool | None:
    """True when the interval lies inside [low, high], False when it lies wholly outside, None when it
    straddles an edge (the point estimate decides without an interval)."""
    if ci is None:
        return None if point is None else low <= point <= high
    lo, hi = ci
    if low <= lo and hi <= high:
        return True
    if hi < low or lo > high:
        return False
    return None


def fmt_ci(ci: Interval | None, digits: int = 2) -> str:
    """' (95% CI x0.91..x1.12)', or '' when the interval is a single value (one seed, or no spread)."""
    if ci is None or abs(ci[1] - ci[0]) < 10 ** -(digits + 1):
        return ""
    return f" (95% CI x{ci[0]:.{digits}f}..x{ci[1]:.{digits}f})"


def combine(*holds: bool | None) -> bool | None:
    """Parts of one claim: False if any part fails, else None if any cannot tell, else True."""
    if any(h is False for h in holds):
        return False
    return None if any(h is None for h in holds) else True


# --------------------------------------------------------------------------- power


def seed_sd(groups: Sequence[Sequence[float]]) -> float | None:
    """Pooled standard deviation of log values within groups (each a cell's seeds); None without a group
    of two."""
    ss, dof = 0.0, 0
    for g in groups:
        logs = [math.log(v) for v in g if v > 0]
        if len(logs) > 1:
            m = mean(logs)
            ss += sum((x - m) ** 2 for x in logs)
            dof += len(logs) - 1
    return math.sqrt(ss / dof) if dof else None


def minimum_detectable_ratio(sd_log: float | None, seeds: int) -> float | None:
    """The smallest ratio of two cells' means (seeds each) a two-sided 5% test detects with 80% power:
    exp(Z_POWER * sd * sqrt(2 / seeds)); None without an sd."""
    if sd_log is None or seeds < 1:
        return None
    return math.exp(Z_POWER * sd_log * math.sqrt(2.0 / seeds))


def proportion_sd(p: float, n: int) -> float:
    """Standard deviation of a proportion p measured over n items: sqrt(p (1 - p) / n)."""
    p = min(max(p, 0.0), 1.0)
    return math.sqrt(p * (1.0 - p) / max(n, 1))


def eval_scatter(series: Sequence[Sequence[float]]) -> float | None:
    """An eval's scatter measured from the runs: the median over runs of the sd of successive evals'
    differences over sqrt 2 (a slow trend cancels in a difference)."""
    sds = []
    for values in series:
        diffs = [b - a for a, b in zip(values, values[1:], strict=False)]
        if len(diffs) > 1:
            m = mean(diffs)
            sds.append(math.sqrt(sum((d - m) ** 2 for d in diffs) / (len(diffs) - 1) / 2.0))
    return median(sds) if sds else None
