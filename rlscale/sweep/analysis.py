"""The sweep's numbers, torch-free: curves per run, samples- and time-to-level, the noise-scale fit, throughput.

Input: one RunData per run (its metrics.jsonl records); output: a SweepAnalysis the report
and the calibration patch read. Time here is the step clock (sum of step_seconds): held-out
evals are left out, since the sweep spaces them equally in samples for every batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import mean, median
from typing import Any

from rlscale.metrics_names import PHASES
from rlscale.plan.calibration import noise_from_steps
from rlscale.records import StepRecord

# Steps left out of the throughput medians: the first ones compile and warm caches.
WARMUP_STEPS = 3
# Levels are measured on this grid (a level of 0.537 would read as more precise than it is).
LEVEL_GRID = 0.01


@dataclass(frozen=True)
class Point:
    samples: float
    seconds: float  # step clock at that eval
    value: float


@dataclass
class RunData:
    """One run of the sweep as measured: its configuration and its metrics.jsonl records."""

    prompts: int
    samples_per_prompt: int
    rule: str
    seed: int
    lr: float
    records: list[StepRecord]
    metric: str = "eval/accuracy"
    window: int = 3
    startup_seconds: float | None = None  # launch to the first step record, measured by the runner
    predicted: dict[str, Any] = field(default_factory=dict)  # the planner's prediction for this run's spec
    source: str = ""  # the run it was read from (one run serves every rule where their lr is the same)
    staleness: int = 0  # the plan's staleness, pinned by the sweep (0: the synchronous loop)

    @property
    def batch(self) -> int:
        return self.prompts * self.samples_per_prompt

    def steps(self) -> list[StepRecord]:
        return self.records

    def evals(self) -> list[Point]:
        """The held-out metric at each eval (the start eval at 0 samples first), on the step clock."""
        pts, clock = [], 0.0
        start = (self.records[0].eval_at_start or {}) if self.records else {}
        if self.metric in start:
            pts.append(Point(0.0, 0.0, float(start[self.metric])))
        for r in self.steps():
            clock += r.step_seconds
            if r.eval is not None:
                pts.append(Point(float(r.samples), clock, float(r.eval)))
        return pts

    def smoothed(self) -> list[Point]:
        """Moving average over `window` evals (the start eval excluded), as the driver's target tracker does."""
        evals = [p for p in self.evals() if p.samples > 0]
        out = []
        for i in range(self.window - 1, len(evals)):
            w = evals[i - self.window + 1:i + 1]
            out.append(Point(evals[i].samples, evals[i].seconds, sum(p.value for p in w) / len(w)))
        return out

    def best(self) -> float | None:
        s = self.smoothed()
        return max(p.value for p in s) if s else None

    def start_value(self) -> float | None:
        e = self.evals()
        return e[0].value if e and e[0].samples == 0 else None

    def throughput(self) -> float | None:
        """Median samples per second of the steps after the warm-up."""
        xs = [r.batch_samples / r.step_seconds for r in self.steps()[WARMUP_STEPS:] if r.step_seconds > 0]
        return median(xs) if xs else None

    def phases(self) -> dict[str, float]:
        out = {}
        for p in PHASES:
            vs = [r.phases[p] for r in self.steps()[WARMUP_STEPS:] if isinstance(r.phases.get(p), (int, float))]
            if vs:
                out[p] = median(vs)
        return out

    def noise_scale(self) -> float | None:
        """B_simple from the run's gradient statistics (None when the gradient is lost in its noise)."""
        return noise_from_steps(self.steps()[WARMUP_STEPS:])

    def samples_total(self) -> int:
        s = self.steps()
        return int(s[-1].samples) if s else 0

    def eval_seconds(self) -> float:
        return sum(r.eval_seconds or 0.0 for r in self.records)


def crossing(curve: list[Point], level: float) -> Point | None:
    """Where a curve first reaches `level`, interpolated linearly from the point before; None if never."""
    prev = None
    for p in curve:
        if p.value >= level:
            if prev is None or p.value == prev.value:
                return p
            f = (level - prev.value) / (p.value - prev.value)
            return Point(prev.samples + f * (p.samples - prev.samples), prev.seconds + f * (p.seconds - prev.seconds),
                         level)
        prev = p
    return None


def measurement_level(runs: list[RunData], target: float) -> float | None:
    """The highest level on the grid every run's moving average reaches, capped at the spec's target."""
    bests = [r.best() for r in runs]
    if not runs or any(b is None for b in bests):
        return None
    lowest = min(min(bests), target)
    return round(math.floor(lowest / LEVEL_GRID + 1e-9) * LEVEL_GRID, 6)


def curve_gap(a: RunData | list[RunData], b: RunData | list[RunData], points: int = 50) -> float | None:
    """Mean |difference| of two (seed-averaged) moving-average curves over the samples both cover."""
    ca, cb = _mean_curve(a), _mean_curve(b)
    if not ca or not cb:
        return None
    lo, hi = max(ca[0][0], cb[0][0]), min(ca[-1][0], cb[-1][0])
    if hi <= lo:
        return None
    grid = [lo + (hi - lo) * i / (points - 1) for i in range(points)]
    return mean(abs(_interp(ca, s) - _interp(cb, s)) for s in grid)


def _mean_curve(runs: RunData | list[RunData]) -> list[tuple[float, float]]:
    runs = [runs] if isinstance(runs, RunData) else runs
    curves = [[(p.samples, p.value) for p in r.smoothed()] for r in runs]
    curves = [c for c in curves if c]
    if not curves:
        return []
    lo, hi = max(c[0][0] for c in curves), min(c[-1][0] for c in curves)
    xs = sorted({x for c in curves for x, _ in c if lo <= x <= hi})
    return [(x, mean(_interp(c, x) for c in curves)) for x in xs]


def _interp(curve: list[tuple[float, float]], x: float) -> float:
    if x <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return curve[-1][1]


@dataclass(frozen=True)
class NoiseFit:
    """E(N) = E_min (1 + N / B_noise), fitted by least squares of E on N."""

    e_min: float
    b_noise: float | None  # None: no penalty measured over the range (slope <= 0)
    b_noise_low: float | None  # the smallest B_noise the data allow (slope + 2 standard errors)
    slope: float
    slope_se: float
    points: int

    @property
    def significant(self) -> bool:
        return self.slope > 2 * self.slope_se and self.b_noise is not None


def fit_noise_scale(points: list[tuple[float, float]]) -> NoiseFit | None:
    """Fit E = a + b N over (N, E) points (every run); B_noise = a / b. None with fewer than 3 points or one N."""
    if len(points) < 3 or len({n for n, _ in points}) < 2:
        return None
    ns, es = [float(n) for n, _ in points], [float(e) for _, e in points]
    n_bar, e_bar = mean(ns), mean(es)
    sxx = sum((n - n_bar) ** 2 for n in ns)
    b = sum((n - n_bar) * (e - e_bar) for n, e in zip(ns, es, strict=True)) / sxx
    a = e_bar - b * n_bar
    resid = sum((e - a - b * n) ** 2 for n, e in zip(ns, es, strict=True))
    se = math.sqrt(resid / (len(ns) - 2) / sxx) if len(ns) > 2 else float("inf")
    b_noise = a / b if b > 0 and a > 0 else None
    high = b + 2 * se
    low = a / high if high > 0 and a > 0 else None
    return NoiseFit(e_min=a, b_noise=b_noise, b_noise_low=low, slope=b, slope_se=se, points=len(ns))


@dataclass
class BatchStats:
    """One (rule, prompts) cell of the sweep: measured over its seeds, and the planner's prediction."""

    rule: str
    prompts: int
    batch: int
    lr: float
    runs: list[RunData]
    level: float | None
    samples_to_level: list[float]  # per seed that reached it
    seconds_to_level: list[float]
    throughput: float | None  # median over seeds of each run's median samples/s
    phases: dict[str, float]
    noise_scale: float | None  # median B_simple over seeds, where measured
    startup_seconds: float | None
    predicted_throughput: float | None = None  # uncalibrated planner
    predicted_throughput_cal: float | None = None  # planner calibrated at the reference batch
    predicted_throughput_fit: float | None = None  # planner with per-phase factors fitted to every batch
    predicted_penalty: float | None = None  # planner's E(N)/E(N_ref) for this rule
    staleness: int = 0
    # per seed: samples and step-clock seconds to the level (seeds that reached it), median samples/s
    seed_samples: dict[int, float] = field(default_factory=dict)
    seed_seconds: dict[int, float] = field(default_factory=dict)
    seed_throughput: dict[int, float] = field(default_factory=dict)

    @property
    def e_mean(self) -> float | None:
        return mean(self.samples_to_level) if self.samples_to_level else None

    @property
    def e_spread(self) -> float | None:
        """Half the range over seeds, relative to the mean (0 with one seed)."""
        if not self.samples_to_level:
            return None
        return (max(self.samples_to_level) - min(self.samples_to_level)) / 2 / mean(self.samples_to_level)

    @property
    def t_mean(self) -> float | None:
        return mean(self.seconds_to_level) if self.seconds_to_level else None

    @property
    def reached_all(self) -> bool:
        return len(self.samples_to_level) == len(self.runs)


def batch_stats(runs: list[RunData], level: float | None) -> list[BatchStats]:
    """Group runs by (rule, prompts, staleness) and measure each cell at `level`."""
    cells: dict[tuple[str, int, int], list[RunData]] = {}
    for r in runs:
        cells.setdefault((r.rule, r.prompts, r.staleness), []).append(r)
    out = []
    for (rule, prompts, staleness), rs in sorted(cells.items()):
        hits = [crossing(r.smoothed(), level) for r in rs] if level is not None else []
        xs = [x for x in (r.throughput() for r in rs) if x is not None]
        phases = {p: median(v) for p in PHASES
                  if (v := [r.phases()[p] for r in rs if p in r.phases()])}
        noise = [n for n in (r.noise_scale() for r in rs) if n is not None]
        starts = [r.startup_seconds for r in rs if r.startup_seconds is not None]
        out.append(BatchStats(
            rule=rule, prompts=prompts, batch=rs[0].batch, lr=rs[0].lr, runs=rs, level=level,
            samples_to_level=[h.samples for h in hits if h is not None],
            seconds_to_level=[h.seconds for h in hits if h is not None],
            throughput=median(xs) if xs else None, phases=phases,
            noise_scale=median(noise) if noise else None,
            startup_seconds=median(starts) if starts else None, staleness=staleness,
            seed_samples={r.seed: h.samples for r, h in zip(rs, hits, strict=False) if h is not None},
            seed_seconds={r.seed: h.seconds for r, h in zip(rs, hits, strict=False) if h is not None},
            seed_throughput={r.seed: x for r in rs if (x := r.throughput()) is not None},
        ))
    return out
