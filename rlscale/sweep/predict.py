"""The planner's predictions for each run of a sweep, uncalibrated and calibrated, and its choice among the batches."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import median
from typing import Any

from rlscale.cpu_split import available_cpus
from rlscale.metrics_names import PHASES
from rlscale.plan import Calibration, make_plan
from rlscale.plan.decision import system_model
from rlscale.sweep.analysis import WARMUP_STEPS, BatchStats, RunData


def run_spec(spec: Any, prompts: int, rule: str, max_samples: int | None = None, staleness: int = 0) -> Any:
    """The spec one sweep run trains with: fixed prompts, the lr rule, the sweep's sample budget, and
    algorithm.maxStaleness at the run's staleness (its plan is pinned there)."""
    s = spec.model_copy(deep=True)
    s.algorithm.max_staleness = staleness
    s.batch.prompts = prompts
    s.batch.min_prompts = min(s.batch.min_prompts, prompts)
    s.batch.max_prompts = max(s.batch.max_prompts, prompts)
    s.optimizer.scaling = rule
    if max_samples is not None:
        s.budget.max_samples = max_samples
        s.budget.max_steps = max(s.budget.max_steps, math.ceil(max_samples / (prompts * s.batch.samples_per_prompt)))
    return s


@dataclass(frozen=True)
class Predicted:
    """The planner's numbers for one (prompts, rule): X on the step clock, E to the spec's target, T = E / X."""

    prompts: int
    rule: str
    lr: float
    samples_per_second: float
    samples_to_target: float
    phases: dict[str, float]

    @property
    def seconds_to_target(self) -> float:
        return self.samples_to_target / self.samples_per_second


def predict(spec: Any, prompts: int, rule: str, cal: Calibration | None = None, staleness: int = 0) -> Predicted:
    """The plan of one sweep run's spec, at its staleness, on this machine's cores as its runs use them."""
    p = make_plan(run_spec(spec, prompts, rule, staleness=staleness), cal, staleness=staleness,
                  host_cores=len(available_cpus()))
    return Predicted(prompts, rule, p.learning_rate, p.predicted.samples_per_second, p.predicted.samples_to_target,
                     p.predicted.phases.to_dict())


def reference_calibration(runs: list[RunData]) -> Calibration:
    """What a run measures of itself: the median phases of its steps (all seeds of one cell)."""
    recs = [r for run in runs for r in run.steps()[WARMUP_STEPS:]]
    return Calibration.from_steps(recs, last=len(recs) or 1, noise_last=len(recs) or 1)


def fitted_calibration(spec: Any, cells: list[BatchStats], ref: BatchStats) -> Calibration | None:
    """Per phase, the geometric mean over all swept batches of measured / modelled seconds, written as the
    phase seconds that factor gives at the reference batch (so that the planner's calibrate() reproduces it)."""
    base = reference_calibration(ref.runs)
    if not base.has_phases:
        return None
    model = system_model(spec, base)
    spp = spec.batch.samples_per_prompt
    rollout = base.rollout_replicas
    learner = base.learner_replicas
    logs: dict[str, list[float]] = {p: [] for p in PHASES}
    seen = set()
    for c in cells:
        if c.prompts in seen:
            continue
        seen.add(c.prompts)
        same = [x for x in cells if x.prompts == c.prompts]
        raw = model.phases(c.prompts, spp, rollout, learner).to_dict()
        for p in PHASES:
            vs = [x.phases[p] for x in same if p in x.phases]
            if vs and raw[p] > 0 and median(vs) > 0:
                logs[p].append(math.log(median(vs) / raw[p]))
    raw_ref = model.phases(ref.prompts, spp, rollout, learner).to_dict()
    fitted = {f"{p}_s": raw_ref[p] * math.exp(sum(v) / len(v)) if v else base.measured(p) for p, v in logs.items()}
    return replace(base, prompts=ref.prompts, samples_per_prompt=spp, noise_scale=None, **fitted)


def fill_predictions(spec: Any, cells: list[BatchStats], ref_prompts: int,
                     fitted: Calibration | None) -> dict[str, dict[int, Predicted]]:
    """Set each cell's predicted throughput (uncalibrated, calibrated at the reference cell, fitted to all cells)
    and the planner's samples penalty E(N)/E(N_ref) for its rule; returns the uncalibrated predictions."""
    refs = [c for c in cells if c.prompts == ref_prompts]
    at_ref = reference_calibration([r for c in refs for r in c.runs]) if refs else None
    out: dict[str, dict[int, Predicted]] = {}
    for c in cells:
        raw = predict(spec, c.prompts, c.rule)
        base = predict(spec, ref_prompts, c.rule)
        c.predicted_throughput = raw.samples_per_second
        c.predicted_penalty = raw.samples_to_target / base.samples_to_target
        if at_ref is not None and at_ref.has_phases:
            c.predicted_throughput_cal = predict(spec, c.prompts, c.rule, replace(at_ref, noise_scale=None)) \
                .samples_per_second
        if fitted is not None:
            c.predicted_throughput_fit = predict(spec, c.prompts, c.rule, fitted).samples_per_second
        out.setdefault(c.rule, {})[c.prompts] = raw
    return out


def planner_choice(spec: Any, prompts: list[int], rule: str, cal: Calibration | None = None) -> int:
    """The batch (prompts) the planner picks among the swept ones: least predicted E / X on the step clock
    (evals left out, as in the sweep's measured times)."""
    times = {p: predict(spec, p, rule, cal).seconds_to_target for p in prompts}
    return min(prompts, key=lambda p: (times[p], p))


def calibration_for_spec(spec: Any, fitted: Calibration | None, noise_scale: float | None) -> tuple[Any, Calibration]:
    """The spec and calibration `rlscale plan --calibration` would use: noise scale merged, phases fitted."""
    s = spec.model_copy(deep=True)
    if noise_scale:
        s.optimizer.noise_scale = float(noise_scale)
    return s, fitted or Calibration()


def model_dump(pred: Predicted) -> dict[str, Any]:
    return {"prompts": pred.prompts, "rule": pred.rule, "lr": pred.lr, "samplesPerSecond": pred.samples_per_second,
            "samplesToTarget": pred.samples_to_target, "phases": pred.phases}
