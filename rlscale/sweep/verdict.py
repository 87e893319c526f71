"""The three claims the planner rests on, judged on a sweep's numbers, in plain words.

Every ratio a verdict rests on carries a 95% bootstrap interval over seeds (rlscale.sweep.stats); a
verdict whose interval straddles its threshold is "inconclusive", whatever its point estimate says.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import mean, median

from rlscale.sweep.analysis import BatchStats
from rlscale.sweep.stats import (
    BySeed,
    Interval,
    bootstrap,
    combine,
    draw_mean,
    fmt_ci,
    ratio_ci,
    side,
    within,
)

# Samples-to-target of two runs differ by about +-15% from seed alone on the builtin task
# (FACTS: run-to-run spread); a ratio within this band of 1 is "the same", unless the
# sweep's own seeds spread wider (then twice their median half-range).
MIN_TOLERANCE = 0.15
# Throughput and time ratios within 5% are ties: a shared machine moves step times by more.
TIE = 0.05


@dataclass(frozen=True)
class Verdict:
    claim: str
    holds: bool | None  # None: the data cannot tell
    text: str

    @property
    def word(self) -> str:
        return {True: "supported", False: "not supported", None: "inconclusive"}[self.holds]


def tolerance(cells: list[BatchStats]) -> float:
    spreads = [c.e_spread for c in cells if c.e_spread is not None and len(c.samples_to_level) > 1]
    return max(MIN_TOLERANCE, 2 * median(spreads)) if spreads else MIN_TOLERANCE


def _ratios(cells: list[BatchStats], ref: int) -> dict[int, tuple[float, Interval | None]]:
    """Per batch, E(N)/E(N_ref) and its interval over seeds."""
    base = next((c for c in cells if c.prompts == ref), None)
    if base is None or base.e_mean is None:
        return {}
    return {c.prompts: (c.e_mean / base.e_mean, ratio_ci(c.seed_samples, base.seed_samples))
            for c in cells if c.e_mean is not None}


def ratio_of_ratios_ci(a: BySeed, a_ref: BySeed, b: BySeed, b_ref: BySeed, how: Callable = mean) -> Interval | None:
    """Interval of (a / a_ref) / (b / b_ref), the four drawn with the same seeds."""
    seeds = sorted(set(a) | set(a_ref) | set(b) | set(b_ref))

    def stat(draw: list[int]) -> float | None:
        vs = [draw_mean(d, draw, how) for d in (a, a_ref, b, b_ref)]
        return vs[0] / vs[1] / (vs[2] / vs[3]) if all(vs) else None

    return bootstrap(seeds, stat)


def _fmt(r: float) -> str:
    return f"x{r:.2f}"


def _first_half(sq: dict[int, tuple[float, Interval | None]], ref: int, tol: float) -> tuple[bool | None, str]:
    """Whether E(N)/E(N_ref) under sqrt stays within the band over a range of batches around the reference."""
    status = {p: within(ci, 1 / (1 + tol), 1 + tol, r) for p, (r, ci) in sq.items()}
    status[ref] = True
    # the contiguous run of swept batches around the reference whose intervals lie within the band
    order = sorted(sq)
    i = order.index(ref)
    lo = hi = i
    while lo > 0 and status[order[lo - 1]] is True:
        lo -= 1
    while hi < len(order) - 1 and status[order[hi + 1]] is True:
        hi += 1
    band = f"within x{1 / (1 + tol):.2f}..x{1 + tol:.2f} of the reference"
    listed = ", ".join(f"{p} prompts {_fmt(sq[p][0])}{fmt_ci(sq[p][1])}" for p in order)
    if lo == 0 and hi == len(order) - 1:
        return True, (f"With the sqrt rule, samples-to-level stayed {band} at every swept batch ({listed}): "
                      "the curves are batch-invariant over the whole swept range.")
    if hi > lo:
        edges = [order[j] for j in (lo - 1, hi + 1) if 0 <= j < len(order) and status[order[j]] is None]
        further = (f" At {' and '.join(map(str, edges))} prompts the interval straddles the band's edge, so the "
                   "range may reach further." if edges else "")
        return True, (f"With the sqrt rule, samples-to-level stayed {band} from {order[lo]} to {order[hi]} prompts "
                      f"only ({listed}): invariance over a bounded range, as the claim says.{further}")
    neighbours = [order[j] for j in (i - 1, i + 1) if 0 <= j < len(order)]
    if all(status[p] is False for p in neighbours):
        return False, (f"With the sqrt rule, no batch next to the reference stayed {band} ({listed}): "
                       "not invariant here.")
    return None, (f"With the sqrt rule, the intervals of the batches next to the reference straddle the band "
                  f"{band} ({listed}): inconclusive at these seeds.")


def claim_invariance(by_rule: dict[str, list[BatchStats]], ref: int, tol: float) -> Verdict:
    """(a) With the sqrt retune, E(N) is about flat over a bounded range; without it, larger batches pay."""
    sq = _ratios(by_rule.get("sqrt", []), ref)
    if len(sq) < 2:
        return Verdict("a", None, "needs the sqrt rule at two or more batches, each reaching the level")
    holds, first = _first_half(sq, ref, tol)
    no = _ratios(by_rule.get("none", []), ref)
    big = max(sq)
    if big in no and big > ref:
        cell = {rule: {c.prompts: c for c in by_rule[rule]} for rule in ("sqrt", "none")}
        r = no[big][0] / sq[big][0]
        ci = ratio_of_ratios_ci(cell["none"][big].seed_samples, cell["none"][ref].seed_samples,
                                cell["sqrt"][big].seed_samples, cell["sqrt"][ref].seed_samples)
        lrs = {rule: cell[rule][big].lr for rule in ("sqrt", "none")}
        if side(ci, 1 + tol, r) is True:
            said, pays = "the larger batch pays, as claimed.", True
        elif side(ci, 1 / (1 + tol), r) is False:
            said = (f"the opposite of the claim's second half: here the retune's larger lr ({lrs['sqrt']:.2e} against "
                    f"{lrs['none']:.2e}) cost samples at {big} prompts, beyond the seed-to-seed band.")
            pays = False
        elif within(ci, 1 / (1 + tol), 1 + tol, r) is True:
            said, pays = "within the seed-to-seed band, so the data do not show that skipping the retune pays.", False
        else:
            said, pays = (f"the interval of none over sqrt{fmt_ci(ci)} straddles the band's edge x{1 + tol:.2f}: "
                          "inconclusive at these seeds."), None
        second = (f" Without the retune (rule none), {big} prompts needed {_fmt(no[big][0])} the reference's samples "
                  f"against {_fmt(sq[big][0])} with sqrt: {said}")
    else:
        second = " The rule none was not measured at a batch above the reference, so its half of the claim is untested."
        pays = None
    return Verdict("a", combine(holds, pays), first + second)


def _throughput_by_seed(cells: list[BatchStats]) -> dict[int, dict[int, float]]:
    """Per batch, each seed's samples/s (the median over the rules that ran it)."""
    out: dict[int, dict[int, list[float]]] = {}
    for c in cells:
        for seed, x in c.seed_throughput.items():
            out.setdefault(c.prompts, {}).setdefault(seed, []).append(x)
    return {p: {s: median(v) for s, v in by.items()} for p, by in out.items()}


def claim_throughput(cells: list[BatchStats]) -> Verdict:
    """(b) Larger batches raise throughput."""
    xs: dict[int, list[float]] = {}
    for c in cells:
        if c.throughput:
            xs.setdefault(c.prompts, []).append(c.throughput)
    pts = sorted((p, median(v)) for p, v in xs.items())
    if len(pts) < 2:
        return Verdict("b", None, "needs throughput at two or more batches")
    listed = ", ".join(f"{p} prompts {x:.0f}" for p, x in pts)
    gain = pts[-1][1] / pts[0][1]
    by_seed = _throughput_by_seed(cells)
    ci = ratio_ci(by_seed.get(pts[-1][0], {}), by_seed.get(pts[0][0], {}), median)
    monotone = all(b[1] >= a[1] * (1 - TIE) for a, b in zip(pts, pts[1:], strict=False))
    rose = side(ci, 1 + TIE, gain)
    if rose is None:
        return Verdict("b", None, f"Throughput from the smallest to the largest batch: x{gain:.2f}{fmt_ci(ci)} "
                       f"({listed} samples/s); the interval straddles the {TIE:.0%} tie: inconclusive.")
    if rose and monotone:
        return Verdict("b", True, f"Throughput rose with the batch ({listed} samples/s): x{gain:.2f}{fmt_ci(ci)} "
                       "from the smallest to the largest batch.")
    if rose:
        return Verdict("b", False, f"Throughput rose overall (x{gain:.2f}{fmt_ci(ci)}) but not at every step "
                       f"({listed} samples/s): on a shared machine this can be noise; rerun on an idle one before "
                       "relying on it.")
    return Verdict("b", False, f"Throughput did not rise with the batch ({listed} samples/s; x{gain:.2f}{fmt_ci(ci)}).")


def _gain_over_penalty_ci(c: BatchStats, base: BatchStats) -> Interval | None:
    """Interval of (X / X_ref) / (E / E_ref): throughput gain over samples penalty, seeds drawn together."""
    seeds = sorted(set(c.seed_samples) | set(base.seed_samples) | set(c.seed_throughput) | set(base.seed_throughput))

    def stat(draw: list[int]) -> float | None:
        x, xr = draw_mean(c.seed_throughput, draw, median), draw_mean(base.seed_throughput, draw, median)
        e, er = draw_mean(c.seed_samples, draw), draw_mean(base.seed_samples, draw)
        return x / xr / (e / er) if x and xr and e and er else None

    return bootstrap(seeds, stat)


def _decision_line(c: BatchStats, base: BatchStats) -> tuple[bool | None, str]:
    """One batch against the reference: (None: a tie or inconclusive; else whether the rule named the faster
    side), and its words."""
    gain, pen, t = c.throughput / base.throughput, c.e_mean / base.e_mean, c.t_mean / base.t_mean
    if abs(math.log(gain / pen)) < math.log(1 + TIE) or abs(math.log(t)) < math.log(1 + TIE):
        return None, f"{c.prompts} prompts: gain x{gain:.2f}, penalty x{pen:.2f}, time x{t:.2f} (a tie)"
    t_ci, gp_ci = ratio_ci(c.seed_seconds, base.seed_seconds), _gain_over_penalty_ci(c, base)
    if side(t_ci, 1.0, t) is None or side(gp_ci, 1.0, gain / pen) is None:
        return None, (f"{c.prompts} prompts: gain x{gain:.2f} over penalty x{pen:.2f} is x{gain / pen:.2f}"
                      f"{fmt_ci(gp_ci)}, time x{t:.2f}{fmt_ci(t_ci)} (inconclusive: an interval straddles x1)")
    ok = (gain > pen) == (t < 1)
    return ok, (f"{c.prompts} prompts: gain x{gain:.2f} {'>' if gain > pen else '<'} penalty x{pen:.2f}, "
                f"measured time x{t:.2f}{fmt_ci(t_ci)} ({'agrees' if ok else 'DISAGREES'})")


def claim_decision(cells: list[BatchStats], ref: int, tol: float) -> Verdict:
    """(c) A larger batch cuts time-to-target only when its throughput gain exceeds its samples penalty."""
    base = next((c for c in cells if c.prompts == ref), None)
    if base is None or not base.t_mean or not base.throughput or not base.e_mean:
        return Verdict("c", None, "the reference batch has no time-to-level")
    results = [_decision_line(c, base) for c in sorted(cells, key=lambda c: c.prompts)
               if c.prompts != ref and c.t_mean and c.throughput and c.e_mean]
    lines = [text for _, text in results]
    judged = [ok for ok, _ in results if ok is not None]
    if not results:
        return Verdict("c", None, "needs a batch besides the reference, each reaching the level")
    if not judged:
        if any("inconclusive" in text for text in lines):
            return Verdict("c", None, "No comparison with the reference was conclusive at these seeds: "
                           + "; ".join(lines) + ".")
        return Verdict("c", None, "Every batch was a tie with the reference (within 5%): "
                       + "; ".join(lines) + ". The rule cannot be told apart from noise here.")
    agree, total = sum(judged), len(judged)
    head = (f"The rule X(N)/X(N_ref) > E(N)/E(N_ref) named the faster side in {agree} of {total} comparisons "
            f"with the reference ({ref} prompts): ")
    return Verdict("c", agree == total, head + "; ".join(lines) + ".")


def planner_verdict(chosen: int, measured: dict[int, float], chosen_cal: int | None,
                    seconds: dict[int, BySeed] | None = None) -> Verdict:
    """Was the planner's batch the measured fastest (time to level on the step clock)? `seconds`: each
    batch's seconds to level by seed, for the interval of the choice's time over the fastest's."""
    if not measured:
        return Verdict("planner", None, "no batch reached the level, so no fastest batch was measured")
    fastest = min(measured, key=measured.get)
    near = measured.get(chosen) is not None and measured[chosen] <= measured[fastest] * (1 + TIE)
    holds: bool | None = chosen == fastest or near
    ci = None
    if not holds and seconds and chosen in seconds and fastest in seconds:
        ci = ratio_ci(seconds[chosen], seconds[fastest])
        if side(ci, 1 + TIE, measured[chosen] / measured[fastest]) is None:
            holds = None
    over = fmt_ci(ci)
    text = (f"The planner (uncalibrated) chose {chosen} prompts; the measured fastest was {fastest} prompts "
            + ("(the same)." if chosen == fastest else
               f"({measured[fastest]:.0f} s vs {measured.get(chosen, float('nan')):.0f} s for the choice"
               + (", within 5%: a tie)." if near else (f"; its time over the fastest's{over})." if over else ").")))
            )
    if holds is None:
        text += " The interval reaches the 5% tie, so the sweep cannot tell the two apart."
    if chosen_cal is not None:
        text += (f" Calibrated with this sweep (--write-calibration), it chooses {chosen_cal} prompts"
                 + (" — the measured fastest." if chosen_cal == fastest else "."))
    return Verdict("planner", holds, text)
