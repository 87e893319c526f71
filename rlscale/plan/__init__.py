"""The planner: batch size, learning rate and rollout/learner split from the batch-size theory (docs/planner.md)."""

from rlscale.plan.calibration import Calibration
from rlscale.plan.decision import Candidate, Plan, Prediction, make_plan
from rlscale.plan.errors import PlanError
from rlscale.plan.profiles import PROFILES, AcceleratorProfile, accelerator_profile
from rlscale.plan.shapes import ModelShape, model_shape_for
from rlscale.plan.throughput import Phases

__all__ = [
    "AcceleratorProfile", "Calibration", "Candidate", "ModelShape", "PROFILES", "Phases", "Plan", "PlanError",
    "Prediction", "accelerator_profile", "make_plan", "model_shape_for",
]
