"""The plan's reason in words: the decision rule X(N2)/X(N1) > E(N2)/E(N1) applied to the winner and its
rival, the learning rate, the replica split and where generation stands (docs/planner.md, section 3)."""

from __future__ import annotations

import math
from typing import Any

from rlscale.plan.calibration import Calibration
from rlscale.plan.staleness import max_staleness
from rlscale.progress import fmt_lr

# A candidate is rlscale.plan.decision.Candidate (not imported: decision imports this module).
Candidate = Any


def _x(a: float, digits: int = 2) -> str:
    return f"x{a:.{digits}f}" if a < 10 else f"x{a:.1f}"


def _digits(a: float, b: float) -> int:
    """Enough decimals that two ratios the rule compares do not print as equal."""
    d = 2
    while d < 4 and f"{a:.{d}f}" == f"{b:.{d}f}":
        d += 1
    return d


def _penalty(big: Candidate, small: Candidate) -> float:
    return big.predicted.samples_to_target / small.predicted.samples_to_target


def _penalty_text(big: Candidate, small: Candidate, scaling: str, digits: int = 2) -> str:
    """'samples penalty x1.3', with the share of an untuned lr when there is one."""
    text = f"samples penalty {_x(_penalty(big, small), digits)}"
    lr_share = big.lr_penalty / small.lr_penalty
    if abs(lr_share - 1) > 0.005:
        why = ("from no lr retune, scaling: none" if scaling == "none"
               else f"from the {scaling} rule's lr off the sqrt rule")
        text += f" ({_x(lr_share)} of it {why})"
    return text


def _effective_throughput(c: Candidate) -> float:
    """Samples per second of the run's clock: steps and their share of the evals."""
    return c.batch / (c.predicted.step_seconds + c.predicted.eval_seconds_per_step)


def explain(spec: Any, win: Candidate, per_batch: list[Candidate], cal: Calibration | None = None,
            absolute_e: bool = False) -> str:
    """One sentence: the decision rule X(N2)/X(N1) > E(N2)/E(N1) applied to the winner and its rival."""
    cal = cal or Calibration()
    scaling, n_ref = spec.optimizer.scaling, spec.optimizer.reference_batch
    others = [c for c in per_batch if c.batch != win.batch]
    if spec.batch.prompts != "auto":
        head = f"N={win.batch} fixed by spec.batch.prompts ({win.prompts} x {win.samples_per_prompt})"
    elif not others:
        head = f"N={win.batch} is the only batch within [minPrompts, maxPrompts]"
    else:
        ref = min(per_batch, key=lambda c: (abs(math.log(c.batch / n_ref)), c.batch))
        rival = ref if ref.batch != win.batch else others[0]
        # Throughput as the run's clock sees it, evals included, so that T = E / X holds exactly.
        speed = _effective_throughput(win) / _effective_throughput(rival)
        verb = "beats" if rival is ref else "kept over"
        if win.batch > rival.batch:
            d = _digits(speed, _penalty(win, rival))
            head = (f"N={win.batch} {verb} N={rival.batch}: throughput {_x(speed, d)} > "
                    f"{_penalty_text(win, rival, scaling, d)}")
        else:
            d = _digits(1 / speed, _penalty(rival, win))
            head = (f"N={win.batch} {verb} N={rival.batch}: throughput gain {_x(1 / speed, d)} < "
                    f"{_penalty_text(rival, win, scaling, d)}")
    if win.placement == "colocated":
        where = "on one cpu host" if spec.hardware.accelerator == "cpu" else (
            f"on {win.gpus} of {spec.budget.gpus} GPUs")
        split = f"{win.learner_replicas} learner replica(s) with one colocated engine each {where}"
    elif spec.hardware.accelerator == "cpu":
        split = f"{win.rollout_replicas} rollout + {win.learner_replicas} learner on one cpu host"
    else:
        split = (f"{win.rollout_replicas} rollout + {win.learner_replicas} learner replicas "
                 f"on {win.gpus} of {spec.budget.gpus} GPUs")
    lr = f"lr {fmt_lr(win.learning_rate)} " + (f"by the {scaling} rule" if scaling != "none" else "(scaling: none)")
    share = win.predicted.generate / win.predicted.step_seconds
    gen = f"generation {share:.0%} of the step, {win.bound}-bound at {win.concurrency} sequences/replica"
    if cal.has_phases:
        basis = f"calibrated from {cal.steps or 1} measured step(s)"
    else:
        basis = "uncalibrated profile"
    if not absolute_e:
        basis += "; only ratios of E decide, so E_ref cancels"
    return f"{head}; {lr}; {split}; {gen} ({basis})."


# --------------------------------------------------------------------------- staleness


def _siblings(win: Any, cands: list[Any]) -> list[Any]:
    """The winner's configuration at the other staleness values."""
    return [c for c in cands if (c.prompts, c.rollout_replicas, c.learner_replicas, c.placement)
            == (win.prompts, win.rollout_replicas, win.learner_replicas, win.placement)
            and c.staleness != win.staleness]


def _compare(faster: Candidate, slower: Candidate) -> tuple[str, str]:
    """('x1.43', 'x1.05'): the clock throughput of `faster` over `slower` and its samples penalty, with
    enough digits that the two do not print as equal."""
    speed = _effective_throughput(faster) / _effective_throughput(slower)
    cost = _penalty(faster, slower)
    d = _digits(speed, cost)
    return _x(speed, d), _x(cost, d)


def staleness_reason(spec: Any, win: Candidate, cands: list[Candidate], p: float, source: str,
                     shared_host: bool, pin: int | None = None) -> str:
    """One sentence on the chosen staleness ("" when maxStaleness is 0): the overlap's throughput gain
    against its samples penalty, weighed as the batch's reason weighs them."""
    top = max_staleness(spec)
    if top == 0:
        return ""
    head = f"Staleness {win.staleness} (maxStaleness {top})"
    if win.placement == "colocated":
        return f"{head}: the colocated engines sleep while the learner trains, so nothing overlaps."
    if pin is not None:
        return f"{head}: pinned by the caller (a sweep measures each staleness)."
    penalty = f"penalty (1 + {p:g})^K, p {source}"
    others = _siblings(win, cands)
    if win.staleness > 0:
        sync = next((c for c in others if c.staleness == 0), None)
        if sync is None:
            return f"{head}: {penalty}."
        speed, cost = _compare(win, sync)
        a, b = win.predicted, sync.predicted
        cores = " (on a cpu host each on its own cores)" if shared_host else ""
        if a.cores:
            cores = (f" (the cpu host's cores split {a.cores[0]} rollout : {a.cores[1]} learner, each phase "
                     "slower on its share than on every core)")
        return (f"{head}: throughput {speed} > samples penalty {cost} against the synchronous loop{cores} "
                f"(step {a.step_seconds:.2f} s vs {b.step_seconds:.2f} s: generate + reward "
                f"{a.generate + a.reward:.2f} s overlaps train {a.train:.2f} s, sync {a.sync:.2f} s does not; "
                f"{penalty}).")
    if not others:
        return f"{head}."
    best = min(others, key=lambda c: c.predicted.time_to_target_seconds)
    speed, cost = _compare(best, win)
    gain = _effective_throughput(best) / _effective_throughput(win)
    if gain > _penalty(best, win):
        return (f"{head}: staleness {best.staleness} gains throughput {speed} against samples penalty {cost}, "
                f"a near tie, which goes to the synchronous loop ({penalty}).")
    return (f"{head}: staleness {best.staleness} gains throughput {speed} < samples penalty {cost} "
            f"(step {best.predicted.step_seconds:.2f} s vs {win.predicted.step_seconds:.2f} s; {penalty}).")
