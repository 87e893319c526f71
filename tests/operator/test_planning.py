"""The operator's use of the planner: calibration from a measured throughput re-plans."""

from __future__ import annotations

from clusterkit import REPO

from rlscale.operator.planning import calibration_from, plan_for
from rlscale.spec import load_rlrun


def test_measured_throughput_calibrates_the_plan():
    spec = load_rlrun(REPO / "examples" / "grpo-h100.yaml").spec
    plan = plan_for(spec)
    slow = plan["predicted"]["samplesPerSecond"] / 2
    cal = {"samplesPerSecond": slow, "prompts": plan["prompts"], "samplesPerPrompt": plan["samplesPerPrompt"],
           "rolloutReplicas": plan["rolloutReplicas"], "learnerReplicas": plan["learnerReplicas"],
           "predictedPhaseSeconds": plan["predicted"]["phases"]}
    c = calibration_from(cal)
    step = plan["prompts"] * plan["samplesPerPrompt"] / slow
    assert abs(sum(c.measured(p) or 0 for p in ("generate", "reward", "train", "sync")) - step) < 1e-6
    again = plan_for(spec, cal)
    assert again["calibrated"] is True
    assert abs(again["predicted"]["samplesPerSecond"] - slow) / slow < 0.2


def test_no_measurement_no_calibration():
    assert calibration_from(None) is None
    assert calibration_from({"samplesPerSecond": 0}) is None
