"""The operator's new plans (a new or changed spec): calibrated from status.calibration, learners kept."""

from __future__ import annotations

import pytest

from rlscale.operator.planning import plan_for
from rlscale.plan import Calibration
from rlscale.spec import load_rlrun
from tests.conftest import EXAMPLES


def spec():
    return load_rlrun(EXAMPLES / "grpo-h100.yaml").spec


def test_a_stored_calibration_calibrates_the_new_plan():
    s = spec()
    plan = plan_for(s)
    ph = plan.predicted.phases
    # status.calibration as a switching re-plan stores it: every phase measured twice as slow.
    cal = Calibration(prompts=plan.prompts, samples_per_prompt=plan.samples_per_prompt,
                      rollout_replicas=plan.rollout_replicas, learner_replicas=plan.learner_replicas,
                      generate_s=2 * ph.generate, reward_s=2 * ph.reward, train_s=2 * ph.train, sync_s=2 * ph.sync,
                      steps=25).to_dict()
    again = plan_for(s, cal)
    assert again.calibrated and not plan.calibrated
    at = next(c for c in again.candidates if (c.key, c.learner_replicas) == (plan.key, plan.learner_replicas))
    assert at.predicted.step_seconds == pytest.approx(2 * plan.predicted.step_seconds, rel=1e-6)


def test_nothing_measured_is_no_calibration():
    s = spec()
    assert not plan_for(s, None).calibrated and plan_for(s, {}) == plan_for(s)
    # A throughput alone (what status.calibration held before the one re-planner) calibrates nothing.
    assert not plan_for(s, {"samplesPerSecond": 20.0, "drift": 0.5}).calibrated


def test_a_new_plan_keeps_the_runs_learner_count_unless_the_spec_fixes_one():
    s = spec()
    assert plan_for(s).learner_replicas != 2
    assert plan_for(s, learners=2).learner_replicas == 2
    fixed = s.model_copy(update={"learner": s.learner.model_copy(update={"replicas": 4})})
    assert plan_for(fixed, learners=2).learner_replicas == 4
