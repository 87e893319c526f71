"""The planner as the operator calls it: spec + stored calibration -> plan dict (camelCase)."""

from __future__ import annotations

from typing import Any

from rlscale.plan import PlanError, make_plan
from rlscale.plan.calibration import PHASES, Calibration
from rlscale.spec import RLRunSpec

__all__ = ["PlanError", "calibration_from", "plan_for"]


def calibration_from(cal: dict[str, Any] | None) -> Calibration | None:
    """status.calibration (what the learner measured, at the configuration it ran) -> Calibration.

    Phase seconds are used when reported; with only a throughput, the measured step time
    (batch / samples per second) is spread over the phases in the plan's predicted proportions.
    """
    if not cal:
        return None
    prompts, spp = cal.get("prompts"), cal.get("samplesPerPrompt")
    phases = {p: float(v) for p, v in (cal.get("phaseSeconds") or {}).items() if p in PHASES and v}
    sps = float(cal.get("samplesPerSecond") or 0)
    if not phases and sps > 0 and prompts and spp:
        step = prompts * spp / sps
        predicted = {p: float(v) for p, v in (cal.get("predictedPhaseSeconds") or {}).items()
                     if p in PHASES and v}
        total = sum(predicted.values())
        phases = ({p: step * v / total for p, v in predicted.items()} if total > 0
                  else {"generate": step})
    noise = cal.get("noiseScale")
    if not phases and not noise:
        return None
    return Calibration(
        prompts=prompts if phases else None, samples_per_prompt=spp if phases else None,
        rollout_replicas=int(cal.get("rolloutReplicas") or 1),
        learner_replicas=int(cal.get("learnerReplicas") or 1),
        generate_s=phases.get("generate"), reward_s=phases.get("reward"),
        train_s=phases.get("train"), sync_s=phases.get("sync"),
        noise_scale=float(noise) if noise else None, steps=int(cal.get("steps") or 1),
    )


def plan_for(spec: RLRunSpec, calibration: dict[str, Any] | None = None,
             learners: int | None = None) -> dict[str, Any]:
    """make_plan(spec, calibration).to_dict(); raises PlanError for specs only the planner can judge.

    `learners`: the learner count the run already has. A re-plan keeps it (while the spec
    leaves learner.replicas on auto): a ZeRO checkpoint resumes only at the data-parallel size
    it was written with, so a new count would strand the run's checkpoints."""
    if learners and spec.learner.replicas == "auto" and learners <= spec.learner.max_replicas:
        spec = spec.model_copy(update={"learner": spec.learner.model_copy(update={"replicas": int(learners)})})
    return make_plan(spec, calibration=calibration_from(calibration)).to_dict()
