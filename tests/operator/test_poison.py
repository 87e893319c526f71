"""Nothing a spec or a driver's report holds poisons the operator (issue 42, item 3): a planner exception
ends the run as Invalid naming the fields to check, no non-finite number reaches status, and a pass that
keeps failing is retried after a pause that grows per run."""

from __future__ import annotations

import dataclasses
import json
import math

import kopf
import pytest
import yaml
from driverkit import measured
from fakekube import FakeKube
from policykit import SETTINGS

from rlscale.operator import constants as C
from rlscale.operator import reconcile as R
from rlscale.operator import settings as OS
from rlscale.operator.finite import finite_only, nonfinite
from rlscale.operator.handlers import INDEX_DEPLOYMENTS, INDEX_PODS, INDEX_STATEFULSETS, RETRY_CAP_S, Handlers
from rlscale.operator.kube import RLRUN_API
from rlscale.operator.planning import plan_for
from rlscale.plan import Plan
from tests.conftest import EXAMPLES

NS, RUN = "team", "r"


@pytest.fixture
def fake() -> FakeKube:
    f = FakeKube()
    f.namespace(NS, **{"pod-security.kubernetes.io/enforce": "restricted"})
    f.create({**yaml.safe_load((EXAMPLES / "grpo-h100.yaml").read_text()), "metadata": {"name": RUN, "namespace": NS}})
    return f


def rlrun(fake: FakeKube) -> dict:
    return fake.get(RLRUN_API, C.RLRUN_KIND, NS, RUN)


def cond(fake: FakeKube, type_: str) -> dict:
    return next((c for c in rlrun(fake)["status"].get("conditions", []) if c["type"] == type_), {})


def children(fake: FakeKube) -> list:
    return [fake.get("apps/v1", k, NS, f"{RUN}-{r}") for k, r in (("Deployment", "rollout"), ("StatefulSet",
                                                                                            "learner"))]


def test_a_planner_exception_ends_the_run_as_invalid_naming_the_fields(fake, monkeypatch):
    def broken(*_, **__):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(R, "plan_for", broken)
    ctl = R.Controller(fake, SETTINGS)
    o = ctl.reconcile(NS, RUN, "create")  # does not raise: kopf has nothing to retry
    assert o is not None and o.refusal is not None and o.refusal[0] == "PlanFailed"
    c = cond(fake, C.COND_INVALID)
    assert c["status"] == "True" and c["reason"] == "PlanFailed"
    assert "ZeroDivisionError" in c["message"] and "spec.hardware" in c["message"]
    assert rlrun(fake)["status"]["phase"] == C.PHASE_FAILED
    assert children(fake) == [None, None]


def test_a_plan_with_a_non_finite_number_is_refused_not_written(fake, monkeypatch):
    def infinite(spec, *a, **kw):
        p = plan_for(spec, *a, **kw)
        return dataclasses.replace(p, predicted=dataclasses.replace(p.predicted, time_to_target_seconds=math.inf))

    monkeypatch.setattr(R, "plan_for", infinite)
    R.Controller(fake, SETTINGS).reconcile(NS, RUN, "create")
    c = cond(fake, C.COND_INVALID)
    assert c["reason"] == "PlanFailed" and "non-finite predicted.timeToTargetSeconds" in c["message"], c
    assert not nonfinite(rlrun(fake)["status"]) and "plan" not in rlrun(fake)["status"]


def _phases(value: float):
    def mutate(m: dict) -> None:
        m["calibration"]["phases"] = {k: value for k in m["calibration"]["phases"]}
    return mutate


@pytest.mark.parametrize("value", [math.nan, math.inf, 0.0, -1.0, 1e-300])
def test_a_driver_report_of_hostile_measurements_neither_raises_nor_reaches_status(fake, value):
    """The progress annotation is the run's pods' word (Python's json reads NaN and Infinity in it)."""
    ctl = R.Controller(fake, SETTINGS)
    ctl.reconcile(NS, RUN, "create")
    plan = Plan.from_dict(rlrun(fake)["status"]["plan"])
    for step in (25, 50):  # two re-plan points: a switch needs both to agree
        m = measured(plan, step, generate=0.3, train=3)
        _phases(value)(m)
        raw = json.dumps({"step": step, "samples": step * plan.batch, "samplesPerSecond": value, "measurements": m})
        fake.patch(RLRUN_API, C.RLRUN_KIND, NS, RUN, {"metadata": {"annotations": {C.ANNOTATION_PROGRESS: raw}}})
        ctl.reconcile(NS, RUN, "progress")
        st = rlrun(fake)["status"]
        assert not nonfinite(st), nonfinite(st)
        assert st["phase"] != C.PHASE_FAILED


def test_a_status_with_a_non_finite_number_is_written_without_it(fake, monkeypatch):
    compute = R.S.compute_status

    def with_nan(o):
        st = compute(o)
        return {**st, "progress": {**(st.get("progress") or {}), "reward": math.nan, "step": 3}}

    monkeypatch.setattr(R.S, "compute_status", with_nan)
    R.Controller(fake, SETTINGS).reconcile(NS, RUN, "create")
    st = rlrun(fake)["status"]
    assert st["progress"] == {"step": 3} and st["phase"] and not nonfinite(st)


def test_finite_only_leaves_out_exactly_the_non_finite_numbers():
    tree = {"a": 1.5, "b": math.nan, "c": [1.0, math.inf, {"d": -math.inf, "e": "x"}], "f": 2}
    assert nonfinite(tree) == ["b", "c[1]", "c[2].d"]
    assert finite_only(tree) == {"a": 1.5, "c": [1.0, None, {"e": "x"}], "f": 2}


class Failing:
    """A Controller whose passes raise until told otherwise."""

    def __init__(self) -> None:
        self.api = FakeKube()
        self.fail = True

    def reconcile(self, namespace, name, trigger, **_):
        if self.fail:
            raise RuntimeError("the API server refused the status")
        return None


def _pass(h: Handlers, name: str) -> float | None:
    """One reconcile_rlrun call as kopf makes it; the retry delay it asks for (None: it succeeded)."""
    idx = {INDEX_PODS: {}, INDEX_DEPLOYMENTS: {}, INDEX_STATEFULSETS: {}}
    try:
        h.reconcile_rlrun(name=name, namespace=NS, body={}, reason="create", memo=kopf.Memo(), **idx)
    except kopf.TemporaryError as exc:
        return exc.delay
    return None


def test_a_failing_pass_is_retried_after_a_pause_that_doubles_per_run_up_to_a_cap():
    ctl = Failing()
    h = Handlers(ctl, OS.OperatorSettings())
    delays = [_pass(h, "a") for _ in range(10)]
    assert delays[:4] == [2.0, 4.0, 8.0, 16.0] and delays[-1] == RETRY_CAP_S
    assert all(x <= y for x, y in zip(delays, delays[1:], strict=False))
    assert _pass(h, "b") == 2.0  # another run's failures are its own
    ctl.fail = False
    assert _pass(h, "a") is None
    ctl.fail = True
    assert _pass(h, "a") == 2.0  # a success starts the count again
