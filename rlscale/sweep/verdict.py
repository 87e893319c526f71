"""The three claims the planner rests on, judged on a sweep's numbers, in plain words."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median

from rlscale.sweep.analysis import BatchStats

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


def _ratios(cells: list[BatchStats], ref: int) -> dict[int, float]:
    base = next((c for c in cells if c.prompts == ref), None)
    if base is None or base.e_mean is None:
        return {}
    return {c.prompts: c.e_mean / base.e_mean for c in cells if c.e_mean is not None}


def _fmt(r: float) -> str:
    return f"x{r:.2f}"


def claim_invariance(by_rule: dict[str, list[BatchStats]], ref: int, tol: float) -> Verdict:
    """(a) With the sqrt retune, E(N) is about flat over a bounded range; without it, larger batches pay."""
    sq = _ratios(by_rule.get("sqrt", []), ref)
    if len(sq) < 2:
        return Verdict("a", None, "needs the sqrt rule at two or more batches, each reaching the level")
    within = sorted(p for p, r in sq.items() if abs(math.log(r)) <= math.log(1 + tol))
    # the contiguous run of swept batches around the reference that stay within the band
    order = sorted(sq)
    i = order.index(ref)
    lo = hi = i
    while lo > 0 and order[lo - 1] in within:
        lo -= 1
    while hi < len(order) - 1 and order[hi + 1] in within:
        hi += 1
    band = f"within x{1 / (1 + tol):.2f}..x{1 + tol:.2f} of the reference"
    listed = ", ".join(f"{p} prompts {_fmt(sq[p])}" for p in order)
    if lo == 0 and hi == len(order) - 1:
        first = (f"With the sqrt rule, samples-to-level stayed {band} at every swept batch ({listed}): "
                 "the curves are batch-invariant over the whole swept range.")
        holds = True
    elif hi > lo:
        first = (f"With the sqrt rule, samples-to-level stayed {band} from {order[lo]} to {order[hi]} prompts only "
                 f"({listed}): invariance over a bounded range, as the claim says.")
        holds = True
    else:
        first = f"With the sqrt rule, no batch next to the reference stayed {band} ({listed}): not invariant here."
        holds = False
    no = _ratios(by_rule.get("none", []), ref)
    big = max(order)
    if big in no and big in sq and big > ref:
        pay = no[big] > sq[big] * (1 + tol)
        lrs = {rule: next((c.lr for c in by_rule.get(rule, []) if c.prompts == big), None) for rule in ("sqrt", "none")}
        if pay:
            said = "the larger batch pays, as claimed."
        elif no[big] * (1 + tol) < sq[big]:
            said = (f"the opposite of the claim's second half: here the retune's larger lr ({lrs['sqrt']:.2e} against "
                    f"{lrs['none']:.2e}) cost samples at {big} prompts, beyond the seed-to-seed band.")
        else:
            said = "within the seed-to-seed band, so the data do not show that skipping the retune pays."
        second = (f" Without the retune (rule none), {big} prompts needed {_fmt(no[big])} the reference's samples "
                  f"against {_fmt(sq[big])} with sqrt: {said}")
        holds = holds and pay if holds is not None else None
    else:
        second = " The rule none was not measured at a batch above the reference, so its half of the claim is untested."
        holds = None if holds else holds
    return Verdict("a", holds, first + second)


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
    monotone = all(b[1] >= a[1] * (1 - TIE) for a, b in zip(pts, pts[1:], strict=False))
    if gain > 1 + TIE and monotone:
        return Verdict("b", True, f"Throughput rose with the batch ({listed} samples/s): x{gain:.2f} from the "
                       "smallest to the largest batch.")
    if gain > 1 + TIE:
        return Verdict("b", False, f"Throughput rose overall (x{gain:.2f}) but not at every step ({listed} "
                       "samples/s): on a shared machine this can be noise; rerun on an idle one before relying on it.")
    return Verdict("b", False, f"Throughput did not rise with the batch ({listed} samples/s; x{gain:.2f}).")


def claim_decision(cells: list[BatchStats], ref: int, tol: float) -> Verdict:
    """(c) A larger batch cuts time-to-target only when its throughput gain exceeds its samples penalty."""
    base = next((c for c in cells if c.prompts == ref), None)
    if base is None or not base.t_mean or not base.throughput or not base.e_mean:
        return Verdict("c", None, "the reference batch has no time-to-level")
    agree, total, lines = 0, 0, []
    for c in sorted(cells, key=lambda c: c.prompts):
        if c.prompts == ref or not (c.t_mean and c.throughput and c.e_mean):
            continue
        gain, pen, t = c.throughput / base.throughput, c.e_mean / base.e_mean, c.t_mean / base.t_mean
        if abs(math.log(gain / pen)) < math.log(1 + TIE) or abs(math.log(t)) < math.log(1 + TIE):
            lines.append(f"{c.prompts} prompts: gain x{gain:.2f}, penalty x{pen:.2f}, time x{t:.2f} (a tie)")
            continue
        total += 1
        ok = (gain > pen) == (t < 1)
        agree += ok
        lines.append(f"{c.prompts} prompts: gain x{gain:.2f} {'>' if gain > pen else '<'} penalty x{pen:.2f}, "
                     f"measured time x{t:.2f} ({'agrees' if ok else 'DISAGREES'})")
    if total == 0:
        return Verdict("c", None, "Every batch was a tie with the reference (within 5%): "
                       + "; ".join(lines) + ". The rule cannot be told apart from noise here.")
    holds = agree == total
    head = (f"The rule X(N)/X(N_ref) > E(N)/E(N_ref) named the faster side in {agree} of {total} comparisons "
            f"with the reference ({ref} prompts): ")
    return Verdict("c", holds, head + "; ".join(lines) + ".")


def planner_verdict(chosen: int, measured: dict[int, float], chosen_cal: int | None) -> Verdict:
    """Was the planner's batch the measured fastest (time to level on the step clock)?"""
    if not measured:
        return Verdict("planner", None, "no batch reached the level, so no fastest batch was measured")
    fastest = min(measured, key=measured.get)
    near = measured.get(chosen) is not None and measured[chosen] <= measured[fastest] * (1 + TIE)
    text = (f"The planner (uncalibrated) chose {chosen} prompts; the measured fastest was {fastest} prompts "
            + ("(the same)." if chosen == fastest else
               f"({measured[fastest]:.0f} s vs {measured.get(chosen, float('nan')):.0f} s for the choice"
               + (", within 5%: a tie)." if near else ")."))
            )
    if chosen_cal is not None:
        text += (f" Calibrated with this sweep (--write-calibration), it chooses {chosen_cal} prompts"
                 + (" — the measured fastest." if chosen_cal == fastest else "."))
    return Verdict("planner", chosen == fastest or near, text)
