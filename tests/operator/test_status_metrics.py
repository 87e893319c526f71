"""The per-run series the chart's alerts read (phase, conditions, steps, the last progress), as a reconcile
pass writes them from the run's status, and dropped with the run."""

from __future__ import annotations

import time

import pytest
from fakekube import FakeKube
from policykit import SETTINGS
from prometheus_client import REGISTRY
from test_reconcile import NS, RUN, become_ready, create, report, rlrun, started

from rlscale.operator import constants as C
from rlscale.operator import metrics as M
from rlscale.operator.reconcile import Controller


@pytest.fixture
def fake() -> FakeKube:
    f = FakeKube()
    f.namespace(NS, **{"pod-security.kubernetes.io/enforce": "restricted"})
    return f


@pytest.fixture
def ctl(fake) -> Controller:
    return Controller(fake, SETTINGS)  # the tests' policy: allows what these runs ask for


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"namespace": NS, "run": RUN, **labels})


def phases() -> dict[str, float | None]:
    return {ph: value("rlscale_operator_run_phase", phase=ph) for ph in M.PHASES}


def test_a_run_s_phase_and_conditions_are_series_to_alert_on(fake, ctl):
    create(fake)
    ctl.reconcile(NS, RUN, "create")
    assert phases()[C.PHASE_PENDING] == 1 and sum(phases().values()) == 1
    assert value("rlscale_operator_run_condition", condition=C.COND_PLANNED, status="True") == 1
    assert value("rlscale_operator_run_condition", condition=C.COND_PLANNED, status="False") == 0
    pending_since = value("rlscale_operator_run_last_progress_timestamp_seconds")
    assert pending_since is not None and abs(pending_since - time.time()) < 60
    become_ready(fake)
    ctl.reconcile(NS, RUN, "learner")
    assert phases()[C.PHASE_RUNNING] == 1 and phases()[C.PHASE_PENDING] == 0
    running_since = value("rlscale_operator_run_last_progress_timestamp_seconds")
    assert running_since >= pending_since  # the clock restarts when the phase changes
    report(fake, step=7, samples=700)
    ctl.reconcile(NS, RUN, "progress")
    assert value("rlscale_operator_run_steps") == 7
    moved = value("rlscale_operator_run_last_progress_timestamp_seconds")
    ctl.reconcile(NS, RUN, "timer")  # no new step: the clock keeps the last one's time
    assert value("rlscale_operator_run_last_progress_timestamp_seconds") == moved


def test_a_failed_run_shows_as_failed_and_a_deleted_one_goes(fake, ctl):
    plan = started(fake, ctl)
    report(fake, step=3, samples=3 * plan.batch, failed=True, outcome="Failed", message="PermanentRunError: no reward")
    ctl.reconcile(NS, RUN, "progress")
    assert rlrun(fake)["status"]["phase"] == C.PHASE_FAILED
    assert phases()[C.PHASE_FAILED] == 1 and phases()[C.PHASE_RUNNING] == 0
    assert value("rlscale_operator_run_condition", condition=C.COND_FAILED, status="True") == 1
    M.forget(NS, RUN)
    assert set(phases().values()) == {None} and value("rlscale_operator_run_steps") is None
    assert value("rlscale_operator_run_condition", condition=C.COND_FAILED, status="True") is None
