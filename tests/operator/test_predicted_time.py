"""The operator publishes a predicted time-to-target (the metric, status.progress's ETA) only where the plan's
samples-to-target was measured: a placeholder's time is no prediction (rlscale/plan/headline.py)."""

from __future__ import annotations

import pytest
from fakekube import FakeKube
from policykit import SETTINGS
from prometheus_client import REGISTRY
from test_reconcile import NS, RUN, become_ready, create, report, rlrun

from rlscale.operator import metrics as M
from rlscale.operator.reconcile import Controller

TTT = "rlscale_operator_predicted_time_to_target_seconds"


@pytest.fixture
def fake() -> FakeKube:
    f = FakeKube()
    f.namespace(NS, **{"pod-security.kubernetes.io/enforce": "restricted"})
    return f


@pytest.fixture
def ctl(fake) -> Controller:
    return Controller(fake, SETTINGS)


def _progress_after_steps(fake: FakeKube, ctl: Controller) -> tuple[dict, float | None]:
    ctl.reconcile(NS, RUN, "create")
    become_ready(fake)
    ctl.reconcile(NS, RUN, "learner")
    report(fake, step=5, samples=5 * 1024, samples_per_second=100.0)
    ctl.reconcile(NS, RUN, "progress")
    return rlrun(fake)["status"]["progress"], REGISTRY.get_sample_value(TTT, {"namespace": NS, "run": RUN})


def test_a_placeholder_samples_to_target_publishes_no_time(fake, ctl):
    M.forget(NS, RUN)
    create(fake)  # the GPU example: no samples-to-target measured for its model and task
    progress, metric = _progress_after_steps(fake, ctl)
    assert rlrun(fake)["status"]["plan"]["samplesToTargetKnown"] is False
    assert metric is None
    assert progress["timeToTarget"] == "unknown" and "etaSeconds" not in progress


def test_a_measured_samples_to_target_publishes_the_time_and_the_eta(fake, ctl):
    M.forget(NS, RUN)
    create(fake, target={"expectedSamples": 400_000})
    progress, metric = _progress_after_steps(fake, ctl)
    plan = rlrun(fake)["status"]["plan"]
    assert plan["samplesToTargetKnown"] is True
    assert metric == pytest.approx(plan["predicted"]["timeToTargetSeconds"])
    left = plan["predicted"]["samplesToTarget"] - 5 * 1024
    assert progress["etaSeconds"] == pytest.approx(left / 100.0, abs=0.1)
    assert progress["timeToTarget"].startswith("eta ")
