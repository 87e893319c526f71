"""The end of a run frees its pods in order: the rollout pods before the Ray head. On SIGTERM a rollout
pod's `ray start --block` drains its node through the head's GCS; scaled down together, the head went
first and each rollout pod waited out Ray's 60 s GCS reconnect timeout before it stopped
(operator/scaling.py stopping)."""

from __future__ import annotations

import datetime as dt

from rlscale.operator import builders as B
from rlscale.operator import constants as C
from rlscale.operator import scaling as SC
from rlscale.operator.reconcile import Controller
from tests.operator.test_reconcile import (  # noqa: F401  (fixtures)
    NS,
    RUN,
    RUNNING,
    SETTINGS,
    add_pod,
    ctl,
    fake,
    replicas,
    report,
    rlrun,
    started,
)

NOW = "2026-12-06T20:00:00Z"
HEAD_UP = {C.ROLE_RAY_HEAD: {"spec": {"replicas": 1}}}


def pod(role: str, deletion: str | None = None) -> dict:
    meta = {"name": f"p-{role}", "labels": B.labels(RUN, role)}
    return {"metadata": {**meta, **({"deletionTimestamp": deletion} if deletion else {})}}


def at(seconds: int) -> str:
    t = dt.datetime.fromisoformat(NOW.replace("Z", "+00:00")) + dt.timedelta(seconds=seconds)
    return t.isoformat().replace("+00:00", "Z")


def test_rollout_pods_within_their_grace_hold_the_head_and_nothing_else_does():
    pods = [pod(C.ROLE_ROLLOUT), pod(C.ROLE_ROLLOUT, at(+150)), pod(C.ROLE_LEARNER), pod(C.ROLE_RAY_HEAD)]
    assert SC.stopping(pods, HEAD_UP, NOW) == 2
    # Past its deletionTimestamp (the end of its grace: a lost node's pod) a pod holds nothing.
    assert SC.stopping([pod(C.ROLE_ROLLOUT, at(-1))], HEAD_UP, NOW) == 0
    # A head already at zero is not started again for pods still going (an operator restarted late).
    assert SC.stopping(pods, {C.ROLE_RAY_HEAD: {"spec": {"replicas": 0}}}, NOW) == 0
    assert SC.stopping(pods, {}, NOW) == 0


def test_a_rollout_pod_that_ignores_its_stop_holds_the_head_no_longer_than_head_hold_s():
    def asked(seconds_ago: int, grace: int = 180) -> dict:
        p = pod(C.ROLE_ROLLOUT, at(grace - seconds_ago))
        p["metadata"]["deletionGracePeriodSeconds"] = grace
        return p

    assert SC.stopping([asked(5)], HEAD_UP, NOW) == 1
    assert SC.stopping([asked(SC.HEAD_HOLD_S - 1)], HEAD_UP, NOW) == 1
    assert SC.stopping([asked(SC.HEAD_HOLD_S + 1)], HEAD_UP, NOW) == 0
    # A grace shorter than the hold ends it first.
    assert SC.stopping([asked(11, grace=10)], HEAD_UP, NOW) == 0


def test_an_ended_run_keeps_only_its_head_while_rollout_pods_stop():
    assert B.desired_replicas(None, None, finished=True, draining=2) == {
        C.ROLE_RAY_HEAD: 1, C.ROLE_ROLLOUT: 0, C.ROLE_LEARNER: 0}
    assert set(B.desired_replicas(None, None, finished=True, draining=0).values()) == {0}


def test_an_ended_run_scales_its_head_to_zero_once_its_rollout_pods_are_gone(fake, ctl):  # noqa: F811
    plan = started(fake, ctl)
    rollout = [add_pod(fake, C.ROLE_ROLLOUT, i, RUNNING) for i in range(plan.rollout_replicas)]
    add_pod(fake, C.ROLE_LEARNER, 0, RUNNING)
    report(fake, step=3, samples=3 * plan.batch, failed=True, message="PermanentRunError: no reward",
           outcome="Failed")
    ctl.reconcile(NS, RUN, "progress")
    assert rlrun(fake)["status"]["phase"] == C.PHASE_FAILED
    assert replicas(fake) == {C.ROLE_RAY_HEAD: 1, C.ROLE_ROLLOUT: 0, C.ROLE_LEARNER: 0}
    for p in rollout[1:]:
        fake.delete("v1", "Pod", NS, p)
    ctl.reconcile(NS, RUN, "progress")
    assert replicas(fake)[C.ROLE_RAY_HEAD] == 1  # one rollout pod still stopping
    fake.delete("v1", "Pod", NS, rollout[0])
    ctl.reconcile(NS, RUN, "progress")  # the learner pod going holds nothing
    assert set(replicas(fake).values()) == {0} and rlrun(fake)["status"]["phase"] == C.PHASE_FAILED
    # An operator started again keeps the ended run at zero.
    add_pod(fake, C.ROLE_ROLLOUT, 9, RUNNING)
    Controller(fake, SETTINGS).reconcile(NS, RUN, "resume")
    assert set(replicas(fake).values()) == {0}
