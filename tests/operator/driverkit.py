"""What a run's driver sends the operator, made up for the tests: the measurements a re-plan reads."""

from __future__ import annotations

from rlscale.plan import Plan
from rlscale.plan.replan import Measurements
from rlscale.records import StepRecord


def measured(plan: Plan, last_step: int, generate: float, train: float, noise: float | None = None) -> dict:
    """The measurements (Measurements.to_dict) a driver running `plan` reports at `last_step`: every
    step timed as the plan predicts, generation x `generate` and training x `train`; `noise`: the
    gradient noise scale each step measured (samples), None for none."""
    ph = plan.predicted.phases
    phases = {"generate": ph.generate * generate, "reward": ph.reward, "train": ph.train * train, "sync": ph.sync}
    step_s, n = sum(phases.values()), plan.batch
    recs = [StepRecord(step=s, samples=s * n, batch_samples=n, prompts=plan.prompts,
                       samples_per_prompt=plan.samples_per_prompt, rollout_replicas=plan.rollout_replicas,
                       learner_replicas=plan.learner_replicas, step_seconds=step_s, samples_per_second=n / step_s,
                       generated_tokens=n * 512, phases=phases, noise_scale=noise) for s in range(1, last_step + 1)]
    return Measurements.from_records(recs).to_dict()


def step_seconds(measurements: dict) -> float:
    """The step time the measurements' calibration says (the sum of its phases)."""
    return sum(Measurements.from_dict(measurements).calibration.to_dict()["phases"].values())
