"""sweep.md: the per-batch tables, predicted next to measured, and the verdict on each claim (torch-free)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rlscale.progress import fmt_lr
from rlscale.sweep.analysis import (
    BatchStats,
    NoiseFit,
    RunData,
    batch_stats,
    crossing,
    fit_noise_scale,
    measurement_level,
)
from rlscale.sweep.analysis import curve_gap as _gap
from rlscale.sweep.power import Power, power, power_lines
from rlscale.sweep.predict import (
    calibration_for_spec,
    fill_predictions,
    fitted_calibration,
    planner_choice,
    predict,
)
from rlscale.sweep.staleness import StalenessFit, staleness_fit, staleness_lines, staleness_verdict
from rlscale.sweep.verdict import (
    Verdict,
    claim_decision,
    claim_invariance,
    claim_throughput,
    planner_verdict,
    tolerance,
)


@dataclass
class SweepResult:
    """Everything the report, the plots and the calibration patch read."""

    name: str
    spec: Any
    runs: list[RunData]
    level: float | None
    cells: list[BatchStats]
    ref_prompts: int
    tol: float
    noise: NoiseFit | None
    fitted: Any  # Calibration | None: per-phase factors fitted over every batch
    verdicts: list[Verdict] = field(default_factory=list)
    chosen: int | None = None
    chosen_cal: int | None = None
    gaps: dict[tuple[str, int], float | None] = field(default_factory=dict)
    stale_runs: list[RunData] = field(default_factory=list)  # runs at staleness above 0 (not in `runs`)
    stale_cells: list[BatchStats] = field(default_factory=list)  # their cells, by batch, rule and staleness
    staleness: StalenessFit | None = None
    power: Power | None = None

    def by_rule(self) -> dict[str, list[BatchStats]]:
        out: dict[str, list[BatchStats]] = {}
        for c in self.cells:
            out.setdefault(c.rule, []).append(c)
        return out

    @property
    def decision_rule(self) -> str:
        """The rule the planner's choice is checked under: the spec's when swept, else sqrt, else any."""
        rules = self.by_rule()
        for r in (self.spec.optimizer.scaling, "sqrt"):
            if r in rules:
                return r
        return next(iter(rules))

    def noise_for_patch(self) -> float | None:
        """B_noise to plan with: the fit where significant, else the smallest value the data allow."""
        if self.noise is None:
            return None
        return self.noise.b_noise if self.noise.significant else self.noise.b_noise_low


def reference_prompts(spec: Any, prompts: list[int]) -> int:
    """The swept batch nearest (in log) to optimizer.referenceBatch."""
    n_ref = spec.optimizer.reference_batch / spec.batch.samples_per_prompt
    return min(prompts, key=lambda p: (abs(math.log(p / n_ref)), p))


def analyse(name: str, spec: Any, runs: list[RunData]) -> SweepResult:
    """The sweep's numbers and verdicts. Runs at staleness above 0 share the level (the one every run
    reaches) and go to the staleness section only; the rest of the report reads the synchronous runs."""
    target = spec.target.value
    level = measurement_level(runs, target)
    stale = [r for r in runs if r.staleness > 0]
    runs = [r for r in runs if r.staleness == 0]
    cells = batch_stats(runs, level)
    prompts = sorted({c.prompts for c in cells})
    ref = reference_prompts(spec, prompts)
    ref_cells = [c for c in cells if c.prompts == ref]
    tol = tolerance(cells)
    res = SweepResult(name, spec, runs, level, cells, ref, tol, None, None)
    rule = res.decision_rule
    pts = [(c.batch, e) for c in cells if c.rule == rule for e in c.samples_to_level]
    res.noise = fit_noise_scale(pts)
    res.fitted = fitted_calibration(spec, cells, ref_cells[0]) if ref_cells else None
    fill_predictions(spec, cells, ref, res.fitted)
    res.chosen = planner_choice(spec, prompts, rule)
    cal_spec, cal = calibration_for_spec(spec, res.fitted, res.noise_for_patch())
    res.chosen_cal = planner_choice(cal_spec, prompts, rule, cal) if (res.fitted or res.noise_for_patch()) else None
    by = res.by_rule()
    for r, cs in by.items():
        refc = [c for c in cs if c.prompts == ref]
        for c in cs:
            res.gaps[(r, c.prompts)] = _gap(c.runs, refc[0].runs) if refc and c.prompts != ref else None
    timed = [c for c in by[rule] if c.t_mean is not None and c.reached_all]
    measured = {c.prompts: c.t_mean for c in timed}
    res.verdicts = [claim_invariance(by, ref, tol), claim_throughput(cells), claim_decision(by[rule], ref, tol),
                    planner_verdict(res.chosen, measured, res.chosen_cal, {c.prompts: c.seed_seconds for c in timed})]
    res.power = power(spec, runs + stale, cells, level)
    if stale:
        _add_staleness(res, stale, rule)
    return res


def _add_staleness(res: SweepResult, stale: list[RunData], rule: str) -> None:
    """Staleness cells beside the synchronous ones of `rule`, the fitted penalty and verdict (d)."""
    res.stale_runs = stale
    res.stale_cells = batch_stats(stale, res.level)
    both = res.stale_cells + [c for c in res.cells if c.rule == rule]
    predicted = {(c.prompts, c.staleness): predict(res.spec, c.prompts, rule, staleness=c.staleness).samples_per_second
                 for c in both}
    res.staleness = staleness_fit(both, rule, predicted)
    res.verdicts.append(staleness_verdict(res.staleness))


def run_rows(res: SweepResult) -> list[dict[str, Any]]:
    """Per run (the staleness runs after the others): what it reached, at the level and at the spec's
    target, its throughput and noise estimate."""
    rows = []
    for r in sorted(res.runs + res.stale_runs, key=lambda r: (r.staleness, r.rule, r.prompts, r.seed)):
        at_level = crossing(r.smoothed(), res.level) if res.level is not None else None
        at_target = crossing(r.smoothed(), res.spec.target.value)
        rows.append({"rule": r.rule, "prompts": r.prompts, "seed": r.seed, "lr": r.lr, "steps": len(r.steps()),
                     "samples": r.samples_total(), "best": r.best(),
                     "samplesToLevel": at_level and at_level.samples, "secondsToLevel": at_level and at_level.seconds,
                     "samplesToTarget": at_target and at_target.samples,
                     "secondsToTarget": at_target and at_target.seconds,
                     "samplesPerSecond": r.throughput(), "phases": r.phases(), "noiseScale": r.noise_scale(),
                     "startupSeconds": r.startup_seconds, "evalSeconds": r.eval_seconds(), "staleness": r.staleness})
    return rows


def _n(v: float | None, fmt: str = ",.0f", dash: str = "-") -> str:
    return dash if v is None else format(v, fmt)


def markdown(res: SweepResult) -> str:
    """sweep.md: what was swept and at which level, the verdicts, a table per lr rule, every run,
    the phases and the noise-scale fit, then the plots."""
    lines = _header(res) + _verdicts(res) + (power_lines(res.power, res.tol) if res.power else [])
    for rule, cells in sorted(res.by_rule().items()):
        lines += _rule_table(res, rule, cells)
    lines += _runs_table(res) + _phases_table(res) + _noise_section(res)
    lines += staleness_lines(res.staleness, res.decision_rule, _distinct(res.stale_runs))
    lines += ["", "![curves](curves.png)", "", "![throughput](throughput.png)", "", "![decision](decision.png)", ""]
    if res.staleness is not None:  # set from the runs ahead, as plots.plot_staleness draws them
        lines += ["![staleness](staleness.png)", ""]
    return "\n".join(lines)


def _distinct(runs: list[RunData]) -> int:
    """Runs, not combinations: at the reference batch one run serves every lr rule (same `source`)."""
    return len({r.source or id(r) for r in runs})


def _header(res: SweepResult) -> list[str]:
    spec, spp = res.spec, res.spec.batch.samples_per_prompt
    metric, target = spec.target.metric, spec.target.value
    seeds = sorted({r.seed for r in res.runs})
    budget = max((r.samples_total() for r in res.runs + res.stale_runs), default=0)
    lines = [f"# Batch-size sweep: RLRun {res.name}", ""]
    distinct = _distinct(res.runs)
    shared = (f" for {len(res.runs)} combinations (at the reference batch every rule gives the same lr: one run "
              "serves them all)" if distinct < len(res.runs) else "")
    batches = ", ".join(str(p) for p in sorted({c.prompts for c in res.cells}))
    ahead = sorted({r.staleness for r in res.stale_runs})
    if ahead:  # the runs generating ahead, counted apart: the batch sections read the synchronous ones
        shared += (f", and {_distinct(res.stale_runs)} more at staleness "
                   f"{', '.join(map(str, ahead))} (section Staleness)")
    lines.append(f"{distinct} runs{shared}: batches {batches} "
                 f"prompts x {spp} samples, lr rules {', '.join(sorted(res.by_rule()))}, seeds "
                 f"{', '.join(map(str, seeds))}; up to {budget:,} samples each. Reference batch: {res.ref_prompts} "
                 f"prompts (optimizer.referenceBatch {spec.optimizer.reference_batch}, lr "
                 f"{fmt_lr(spec.optimizer.lr)}).")
    lines.append("")
    if res.level is None:
        lines.append(f"**No level measured**: some run recorded no full moving average of {metric}.")
        return lines
    note = ("the spec's target" if res.level >= target else
            f"below the spec's target {target}: the highest level every run reached within its sample budget")
    lines.append(f"**Samples- and time-to-level are measured at {metric} = {res.level:.2f}** ({note}; moving "
                 f"average of {spec.target.window} evals, evals at equal sample spacing for every batch). "
                 "Times are on the step clock: held-out evals excluded.")
    starts = [r.start_value() for r in res.runs if r.start_value() is not None]
    if starts:
        lines.append(f"Before training, {metric} was {min(starts):.3f}-{max(starts):.3f}.")
    if res.power is not None and res.power.warning:
        lines.append(f"\n**Warning: {res.power.warning}.**")
    return lines


CLAIMS = {"a": "(a) sample curves batch-invariant with the sqrt retune, bounded range; untuned larger batches pay",
          "b": "(b) larger batches raise generation throughput",
          "c": "(c) a larger batch is faster only when throughput gain > samples penalty",
          "planner": "the planner's choice was the measured fastest",
          "d": "(d) staleness is faster only when its throughput gain > its samples penalty"}


def _verdicts(res: SweepResult) -> list[str]:
    lines = ["", "## Verdicts", ""]
    lines += [f"- **{CLAIMS[v.claim]}: {v.word}.** {v.text}" for v in res.verdicts]
    lines.append(f"\nSeed-to-seed band used for 'the same': x{1 + res.tol:.2f} (the larger of 15% and twice the "
                 "median seed half-range).")
    return lines


def _rule_table(res: SweepResult, rule: str, cells: list) -> list[str]:
    lines = ["", f"## Rule {rule}", "",
             "| prompts | N | lr | samples to level (mean) | spread over seeds | reached | planner E/E_ref | "
             "measured E/E_ref | curve gap vs ref | samples/s | planner samples/s (uncal / cal@ref / fit) | "
             "time to level (s) | planner T/T_ref | measured T/T_ref | start-up (s) | B_simple |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = next((c for c in cells if c.prompts == res.ref_prompts), None)
    for c in sorted(cells, key=lambda c: c.prompts):
        e_rel = c.e_mean / base.e_mean if base and base.e_mean and c.e_mean else None
        t_rel = c.t_mean / base.t_mean if base and base.t_mean and c.t_mean else None
        pt = None
        if base and c.predicted_penalty and c.predicted_throughput and base.predicted_throughput:
            pt = c.predicted_penalty / (c.predicted_throughput / base.predicted_throughput)
        gap = res.gaps.get((rule, c.prompts))
        lines.append(
            f"| {c.prompts} | {c.batch} | {fmt_lr(c.lr)} | {_n(c.e_mean)} | "
            f"{'+-' + format(c.e_spread, '.0%') if c.e_spread is not None else '-'} | "
            f"{len(c.samples_to_level)}/{len(c.runs)} | {_n(c.predicted_penalty, '.2f')} | {_n(e_rel, '.2f')} | "
            f"{_n(gap, '.3f')} | {_n(c.throughput, '.1f')} | {_n(c.predicted_throughput, '.1f')} / "
            f"{_n(c.predicted_throughput_cal, '.1f')} / {_n(c.predicted_throughput_fit, '.1f')} | "
            f"{_n(c.t_mean, '.0f')} | {_n(pt, '.2f')} | {_n(t_rel, '.2f')} | {_n(c.startup_seconds, '.0f')} | "
            f"{_n(c.noise_scale)} |")
    return lines


def _runs_table(res: SweepResult) -> list[str]:
    target = res.spec.target.value
    lines = ["", "Columns: *planner E/E_ref* is the planner's samples penalty (noise curve x lr-mismatch penalty); "
             "*curve gap* the mean |difference| of the seed-averaged moving-average curves against the reference "
             "batch over the samples both cover; *cal@ref*: the planner calibrated from the reference batch's "
             "measured phases (what a run does to itself); *fit*: per-phase factors fitted over every batch "
             "(what --write-calibration writes); *B_simple*: the gradient-noise estimate from the runs' "
             "gradient statistics (median over seeds; - where the gradient was lost in its noise)."]
    lines += ["", "## Runs", "", "| rule | prompts | seed | steps | samples | best moving avg | samples to level | "
              f"seconds to level | samples to target {target} | samples/s | B_simple | start-up (s) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in run_rows(res):
        rule = r["rule"] + (f", staleness {r['staleness']}" if r["staleness"] else "")
        lines.append(f"| {rule} | {r['prompts']} | {r['seed']} | {r['steps']} | {r['samples']:,} | "
                     f"{_n(r['best'], '.3f')} | {_n(r['samplesToLevel'])} | {_n(r['secondsToLevel'], '.0f')} | "
                     f"{_n(r['samplesToTarget'], ',.0f', 'not reached')} | {_n(r['samplesPerSecond'], '.1f')} | "
                     f"{_n(r['noiseScale'])} | {_n(r['startupSeconds'], '.0f')} |")
    return lines


def _phases_table(res: SweepResult) -> list[str]:
    """Median phase seconds per cell; with runs ahead, a staleness column (on a cpu host those ran on their
    share of the cores, the synchronous ones on every core: the table shows what the split cost)."""
    phases = ("generate", "reward", "train", "sync")
    ahead = bool(res.stale_cells)
    lines = ["", "## Phases (median seconds per step)", "",
             "| rule | prompts | " + ("staleness | " if ahead else "") + " | ".join(phases) + " |",
             "|---|---:|" + ("---:|" if ahead else "") + "---:|---:|---:|---:|"]
    for c in sorted(res.cells + res.stale_cells, key=lambda c: (c.rule, c.prompts, c.staleness)):
        lag = f"{c.staleness} | " if ahead else ""
        lines.append(f"| {c.rule} | {c.prompts} | {lag}" + " | ".join(_n(c.phases.get(p), '.4f') for p in phases)
                     + " |")
    return lines


def _noise_section(res: SweepResult) -> list[str]:
    lines = ["", "## Noise scale", ""]
    nf = res.noise
    if nf is None:
        lines.append("Not fitted: fewer than three samples-to-level points at two or more batches.")
        return lines
    fit = (f"B_noise = {nf.b_noise:,.0f} samples" if nf.b_noise else "no samples penalty over the swept range "
           "(slope <= 0), so B_noise is above it")
    low = (f"; the smallest B_noise the data allow (slope + 2 s.e.): {nf.b_noise_low:,.0f}" if nf.b_noise_low
           else "; the data put no lower bound on it")
    lines.append(f"Least squares of E on N over {nf.points} runs (rule {res.decision_rule}): E_min = "
                 f"{nf.e_min:,.0f}, slope {nf.slope:.1f} +- {nf.slope_se:.1f} samples per sample of batch: "
                 f"{fit}{low}. The spec says optimizer.noiseScale = {res.spec.optimizer.noise_scale or 'unset'}.")
    patch = res.noise_for_patch()
    if patch:
        lines.append(f"--write-calibration writes noiseScale {patch:,.0f} "
                     + ("(the fit)." if nf.significant else "(the lower bound: the penalty is not significant)."))
    return lines
