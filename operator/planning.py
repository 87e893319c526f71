"""The planner as the operator calls it for a new plan (a new or changed spec): spec + status.calibration
-> Plan. Between steps the run is re-planned by rlscale.plan.replan, the policy the driver runs too."""

from __future__ import annotations

from typing import Any

from rlscale.plan import Plan, PlanError, make_plan
from rlscale.plan.calibration import Calibration
from rlscale.plan.replan import keep_learners
from rlscale.spec import RLRunSpec

__all__ = ["PlanError", "plan_for"]


def plan_for(spec: RLRunSpec, calibration: dict[str, Any] | None = None, learners: int | None = None,
             placement: str | None = None) -> Plan:
    """make_plan(spec, calibration); raises PlanError for specs only the planner can judge.

    `calibration`: status.calibration (Calibration.to_dict(): what the run measured at the last
    re-plan that switched). `learners`: the learner count the run already has, which a new plan
    keeps (keep_learners says why). `placement`: the running run's, which a new plan keeps."""
    return make_plan(keep_learners(spec, learners), Calibration.from_dict(calibration), placement)
