"""The staleness half of a sweep (`rlscale sweep --staleness 0,1,2`): per batch, samples-, throughput-
and time-to-level at each staleness K against the synchronous loop (K = 0, the same batch, rule and
seeds), the penalty p of E(K) = E(0) (1 + p)^K fitted with its interval over seeds, and verdict (d).
Torch-free; docs/planner.md, section 5."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import mean, median

from rlscale.sweep.analysis import BatchStats
from rlscale.sweep.stats import Interval, bootstrap, draw_mean, fmt_ci, ratio_ci, side
from rlscale.sweep.verdict import TIE, Verdict


@dataclass(frozen=True)
class StalenessRow:
    """One batch at staleness K against K = 0: measured ratios with their intervals, and the planner's gain."""

    prompts: int
    staleness: int
    penalty: float | None  # E_K / E_0
    penalty_ci: Interval | None
    gain: float | None  # X_K / X_0, measured samples/s
    gain_ci: Interval | None
    time: float | None  # T_K / T_0 on the step clock
    time_ci: Interval | None
    predicted_gain: float | None = None  # the planner's X_K / X_0 (uncalibrated)


@dataclass
class StalenessFit:
    """p in (1 + p)^K fitted over every (batch, K > 0) pair, its interval, and the rows it came from."""

    p: float | None
    ci: Interval | None
    points: int
    rows: list[StalenessRow] = field(default_factory=list)

    @property
    def for_patch(self) -> float | None:
        """p for the planner: never below 0 (staleness is not assumed to save samples)."""
        return None if self.p is None else round(max(self.p, 0.0), 4)


def fit_penalty(points: list[tuple[int, float]]) -> float | None:
    """p from (K, E_K / E_0) points: log(1 + p) = sum K log r / sum K^2, least squares through the origin
    (E_0 / E_0 = 1 at K = 0 by construction). None without a point at K > 0."""
    pts = [(k, r) for k, r in points if k > 0 and r > 0]
    if not pts:
        return None
    slope = sum(k * math.log(r) for k, r in pts) / sum(k * k for k, _ in pts)
    return math.exp(slope) - 1.0


def _pairs(cells: list[BatchStats], rule: str) -> list[tuple[BatchStats, BatchStats]]:
    """(K = 0 cell, K > 0 cell) at the same batch under `rule`."""
    sync = {c.prompts: c for c in cells if c.rule == rule and c.staleness == 0}
    return [(sync[c.prompts], c) for c in sorted(cells, key=lambda c: (c.staleness, c.prompts))
            if c.rule == rule and c.staleness > 0 and c.prompts in sync]


def _ratio(a: dict[int, float], b: dict[int, float], how: Callable = mean) -> float | None:
    return how(a.values()) / how(b.values()) if a and b else None


def staleness_fit(cells: list[BatchStats], rule: str,
                  predicted: dict[tuple[int, int], float] | None = None) -> StalenessFit | None:
    """The rows and the fitted penalty; None when no batch ran at K > 0 and K = 0 both. `predicted`:
    the planner's samples/s per (prompts, K)."""
    pairs = _pairs(cells, rule)
    if not pairs:
        return None
    predicted = predicted or {}
    rows = []
    for base, c in pairs:
        x0 = predicted.get((c.prompts, 0))
        rows.append(StalenessRow(
            c.prompts, c.staleness, _ratio(c.seed_samples, base.seed_samples),
            ratio_ci(c.seed_samples, base.seed_samples), _ratio(c.seed_throughput, base.seed_throughput, median),
            ratio_ci(c.seed_throughput, base.seed_throughput, median), _ratio(c.seed_seconds, base.seed_seconds),
            ratio_ci(c.seed_seconds, base.seed_seconds),
            predicted[(c.prompts, c.staleness)] / x0 if x0 and (c.prompts, c.staleness) in predicted else None))
    points = [(r.staleness, r.penalty) for r in rows if r.penalty is not None]
    seeds = sorted({s for b, c in pairs for s in (*b.seed_samples, *c.seed_samples)})

    def stat(draw: list[int]) -> float | None:
        pts = []
        for b, c in pairs:
            e0, ek = draw_mean(b.seed_samples, draw), draw_mean(c.seed_samples, draw)
            if e0 and ek:
                pts.append((c.staleness, ek / e0))
        return fit_penalty(pts)

    return StalenessFit(fit_penalty(points), bootstrap(seeds, stat) if points else None, len(points), rows)


def staleness_verdict(fit: StalenessFit | None) -> Verdict:
    """(d) Staleness K is faster to level than the synchronous loop only when its throughput gain exceeds
    its samples penalty; ties (5%) and comparisons whose interval straddles x1 are left out."""
    if fit is None:
        return Verdict("d", None, "needs a batch run at staleness 0 and above, each reaching the level")
    agree, total, lines = 0, 0, []
    for r in fit.rows:
        if r.gain is None or r.penalty is None or r.time is None:
            lines.append(f"{r.prompts} prompts at staleness {r.staleness}: did not reach the level")
            continue
        head = f"{r.prompts} prompts at staleness {r.staleness}: gain x{r.gain:.2f}, penalty x{r.penalty:.2f}"
        if abs(math.log(r.gain / r.penalty)) < math.log(1 + TIE) or abs(math.log(r.time)) < math.log(1 + TIE):
            lines.append(f"{head}, time x{r.time:.2f} (a tie)")
            continue
        if side(r.time_ci, 1.0, r.time) is None:
            lines.append(f"{head}, time x{r.time:.2f}{fmt_ci(r.time_ci)} (inconclusive: the interval straddles x1)")
            continue
        ok = (r.gain > r.penalty) == (r.time < 1)
        total, agree = total + 1, agree + ok
        lines.append(f"{r.prompts} prompts at staleness {r.staleness}: gain x{r.gain:.2f} "
                     f"{'>' if r.gain > r.penalty else '<'} penalty x{r.penalty:.2f}, measured time "
                     f"x{r.time:.2f}{fmt_ci(r.time_ci)} ({'agrees' if ok else 'DISAGREES'})")
    fitted = ""
    if fit.p is not None:
        fitted = f" Fitted penalty: p = {fit.p:.3f} per step of staleness{_p_ci(fit.ci)} over {fit.points} point(s)."
    if total == 0:
        return Verdict("d", None, "No staleness comparison was conclusive: " + "; ".join(lines) + "." + fitted)
    return Verdict("d", agree == total, f"The rule throughput gain > samples penalty named the faster side in {agree} "
                   f"of {total} comparisons with the synchronous loop: " + "; ".join(lines) + "." + fitted)


def _p_ci(ci: Interval | None) -> str:
    return f" (95% CI {ci[0]:.3f}..{ci[1]:.3f})" if ci and ci[1] - ci[0] > 1e-4 else ""


def staleness_lines(fit: StalenessFit | None, rule: str, runs: int) -> list[str]:
    """sweep.md's staleness section: the table, the fit, and what the patch carries."""
    if fit is None:
        return []
    lines = ["", f"## Staleness (rule {rule})", "",
             f"{runs} runs at staleness above 0, each with algorithm.maxStaleness set to its K and the plan pinned "
             "there; each row against the same batch, rule and seeds at staleness 0.", "",
             "| prompts | K | samples penalty E_K/E_0 | throughput gain X_K/X_0 | planner X_K/X_0 | time T_K/T_0 |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in fit.rows:
        lines.append(f"| {r.prompts} | {r.staleness} | {_cell(r.penalty, r.penalty_ci)} | {_cell(r.gain, r.gain_ci)} "
                     f"| {_cell(r.predicted_gain, None)} | {_cell(r.time, r.time_ci)} |")
    if fit.p is None:
        lines.append("\nNo penalty fitted: no batch reached the level at staleness 0 and above.")
        return lines
    lines.append(f"\nLeast squares of log(E_K / E_0) = K log(1 + p) through the origin over {fit.points} point(s): "
                 f"p = {fit.p:.3f}{_p_ci(fit.ci)}. --write-calibration writes calibration.stalenessPenalty "
                 f"{fit.for_patch:g}" + (" (the fit is below 0; the planner never assumes staleness saves samples)."
                                         if fit.p < 0 else "."))
    return lines


def _cell(v: float | None, ci: Interval | None) -> str:
    return "-" if v is None else f"x{v:.2f}{fmt_ci(ci)}"
