"""Failures the pods' restarts do not show, and deadlines (issue 42, item 5): a pod evicted, preempted or
lost with its node counts against spec.failurePolicy.backoffLimit; a pod stuck before it runs (an image
that does not pull, no node that fits it) past podStartTimeoutSeconds, or a run past
activeDeadlineSeconds, ends the run with that reason. Pure functions and status passes, with the time given."""

from __future__ import annotations

import datetime as dt

import yaml

from rlscale.operator import constants as C
from rlscale.operator import deadlines as D
from rlscale.operator import faults as F
from rlscale.operator import status as S
from rlscale.operator.observed import Observed
from rlscale.spec import parse_spec
from tests.conftest import EXAMPLES

T0 = "2026-12-01T03:00:00Z"
RUNNING = {"name": "learner", "restartCount": 0, "state": {"running": {}}}


def at(seconds: float) -> str:
    return (dt.datetime(2026, 12, 1, 3, tzinfo=dt.UTC) + dt.timedelta(seconds=seconds)).isoformat().replace(
        "+00:00", "Z")


def pod(name, role=C.ROLE_LEARNER, uid=None, statuses=(RUNNING,), conditions=(), **status):
    meta = {"name": name, "labels": {C.LABEL_RUN: "r", C.LABEL_ROLE: role}, **({"uid": uid} if uid else {})}
    return {"metadata": meta, "status": {"phase": "Running", "containerStatuses": list(statuses),
                                         "conditions": list(conditions), **status}}


def evicted(name, uid, reason="EvictionByEvictionAPI"):
    return pod(name, uid=uid, conditions=[{"type": "DisruptionTarget", "status": "True", "reason": reason,
                                           "message": "Eviction API: evicting"}])


def pulling(name, reason="ImagePullBackOff", role=C.ROLE_LEARNER, uid="u"):
    return pod(name, role, uid, statuses=[{"name": "learner", "restartCount": 0, "state": {"waiting": {
        "reason": reason, "message": 'Back-off pulling image "registry.example/unpullable:0"'}}}], phase="Pending")


def unschedulable(name, role):
    return pod(name, role, "u", statuses=[], phase="Pending", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}])


# ---------------------------------------------------------------- disruptions count against the budget


def test_the_disruptions_are_told_apart_and_a_running_pod_is_none():
    assert "evicted (EvictionByEvictionAPI" in F.disruption(evicted("r-learner-0", "a"))
    assert "preempted" in F.disruption(evicted("r-learner-0", "a", "PreemptionByScheduler"))
    assert "taint manager" in F.disruption(evicted("r-learner-0", "a", "DeletionByTaintManager"))
    kubelet = pod("r-rollout-x", C.ROLE_ROLLOUT, phase="Failed", reason="Evicted",
                  message="The node was low on resource: memory.")
    assert "failed on its node (Evicted: The node was low on resource: memory.)" in F.disruption(kubelet)
    assert F.disruption(pod("r-learner-0")) is None
    # Ended by its node, it is no problem of the run's (its workload replaces it), and its health moved.
    assert S.pod_problems(kubelet) == [] and S.pod_signature(kubelet) != S.HEALTHY_POD


def test_a_drained_nodes_ranks_are_one_fault_counted_once_and_past_the_limit_end_the_run():
    rec = F.advance(None, [pod("r-learner-0", uid="a"), pod("r-learner-1", uid="b")], 40, 50, T0)
    assert rec == {}
    # The eviction seen on a pass while the pod terminates, then its DELETED event: one pod, counted once.
    rec = F.advance(rec, [evicted("r-learner-0", "a"), pod("r-learner-1", uid="b")], 40, 50, at(1))
    assert rec["count"] == 1 and "r-learner-0 evicted" in rec["lastCause"] and rec["disrupted"] == ["a"]
    rec = F.advance(rec, [pod("r-learner-1", uid="b")], 40, 50, at(2), gone=[evicted("r-learner-0", "a")])
    assert rec["count"] == 1
    # The other rank on the same node, a second later: the same fault.
    rec = F.advance(rec, [pod("r-learner-0", uid="c")], 40, 50, at(3), gone=[evicted("r-learner-1", "b")])
    assert rec["count"] == 1 and rec["windowPods"] == ["r-learner-0", "r-learner-1"]
    # Its replacement preempted past the window: a second fault, which a limit of 1 does not allow.
    rec = F.advance(rec, [evicted("r-learner-0", "c", "PreemptionByScheduler")], 41, 50, at(F.WINDOW_SECONDS + 10))
    assert rec["count"] == 2 and F.exceeded(rec, 1)
    msg = F.message(rec, 1)
    assert msg.startswith("2 faults (the last: pod r-learner-0 preempted (PreemptionByScheduler")
    assert "exceed spec.failurePolicy.backoffLimit (1)" in msg
    # A restart fault after it speaks of restarts again.
    restarted = pod("r-learner-0", uid="d", statuses=[dict(RUNNING, restartCount=1)])
    later = F.advance(rec, [restarted], 41, 50, at(2 * F.WINDOW_SECONDS + 20))
    assert "lastCause" not in later and "restarts of the learner pods" in F.message(later, 5)


def test_an_evicted_pod_fails_a_run_with_no_budget_left_naming_the_eviction():
    spec = parse_spec({**_example(), "failurePolicy": {"backoffLimit": 0}})
    rl = {"metadata": {"name": "r", "namespace": "ns", "generation": 1}, "status": {}}
    o = Observed(rl, "pod", [pod("r-learner-1", uid="b")], {}, spec=spec, gone=[evicted("r-learner-0", "a")])
    st = S.compute_status(o, now=T0)
    f = S.condition(st["conditions"], C.COND_FAILED)
    assert (f["status"], f["reason"]) == ("True", "BackoffLimitExceeded") and st["phase"] == C.PHASE_FAILED
    assert "pod r-learner-0 evicted (EvictionByEvictionAPI: Eviction API: evicting)" in f["message"]


# ---------------------------------------------------------------- a pod that does not start


def test_a_pod_stuck_pulling_its_image_ends_the_run_past_its_start_deadline():
    rec = D.waiting_after(None, [pulling("r-learner-0", "ErrImagePull")], T0)
    assert rec == {"r-learner-0": {"reason": "ErrImagePull", "since": T0, "uid": "u"}}
    # ErrImagePull and ImagePullBackOff take turns: the same wait.
    rec = D.waiting_after(rec, [pulling("r-learner-0")], at(300))
    assert rec["r-learner-0"]["since"] == T0
    assert D.stuck_past(rec, [pulling("r-learner-0")], at(600), 600) is None
    reason, msg = D.stuck_past(rec, [pulling("r-learner-0")], at(601), 600)
    assert reason == "ImagePullBackOff" and 'Back-off pulling image "registry.example/unpullable:0"' in msg
    assert "waited 601 s, past spec.failurePolicy.podStartTimeoutSeconds (600)" in msg
    assert D.stuck_past(rec, [pulling("r-learner-0")], at(10**6), 0) is None  # 0: wait for ever
    # A pod that pulled, or a new pod under the name, starts again.
    assert D.waiting_after(rec, [pod("r-learner-0", uid="u")], at(400)) == {}
    assert D.waiting_after(rec, [pulling("r-learner-0", uid="v")], at(400))["r-learner-0"]["since"] == at(400)
    # Another kind of wait is a new one.
    config = pulling("r-learner-0", "CreateContainerConfigError")
    assert D.waiting_after(rec, [config], at(400))["r-learner-0"]["since"] == at(400)


def test_unschedulable_rollout_pods_wait_while_the_driver_serves_with_fewer():
    pods = [unschedulable("r-rollout-a", C.ROLE_ROLLOUT), unschedulable("r-learner-1", C.ROLE_LEARNER)]
    rec = D.waiting_after(None, pods, T0, exempt_unschedulable=(C.ROLE_ROLLOUT,))
    assert set(rec) == {"r-learner-1"}
    reason, msg = D.stuck_past(rec, pods, at(700), 600)
    assert reason == "Unschedulable" and "pod r-learner-1 cannot be scheduled: 0/4 nodes" in msg
    assert set(D.waiting_after(None, pods, T0)) == {"r-rollout-a", "r-learner-1"}


def test_a_stuck_pod_fails_the_run_through_status_with_its_reason():
    spec = parse_spec(_example())
    rl = {"metadata": {"name": "r", "namespace": "ns", "generation": 1}, "status": {}}
    st = S.compute_status(Observed(rl, "pod", [pulling("r-learner-0")], {}, spec=spec), now=T0)
    assert st["waiting"]["r-learner-0"]["since"] == T0 and S.condition(st["conditions"], C.COND_FAILED) is None
    rl["status"] = st
    st = S.compute_status(Observed(rl, "pod", [pulling("r-learner-0")], {}, spec=spec), now=at(601))
    f = S.condition(st["conditions"], C.COND_FAILED)
    assert (f["status"], f["reason"]) == ("True", "ImagePullBackOff") and st["phase"] == C.PHASE_FAILED
    assert f["message"].endswith("(600); workloads scaled to zero") and S.finished(st)


# ---------------------------------------------------------------- the run's deadline


def test_the_start_time_is_reset_by_a_resume_or_a_retry():
    assert D.start_time(None, T0, suspended=False, retried=False) == T0
    assert D.start_time(T0, at(5), suspended=False, retried=False) == T0
    assert D.start_time(T0, at(5), suspended=True, retried=False) is None
    assert D.start_time(T0, at(5), suspended=False, retried=True) == at(5)
    assert D.deadline_past(T0, at(60), 60) is None and D.deadline_past(T0, at(60), None) is None
    reason, msg = D.deadline_past(T0, at(61), 60)
    assert reason == "DeadlineExceeded" and f"active 61 s since {T0}, past spec.activeDeadlineSeconds (60)" in msg


def test_a_run_past_its_active_deadline_fails_and_a_suspended_one_does_not_count():
    spec = parse_spec({**_example(), "activeDeadlineSeconds": 3600})
    rl = {"metadata": {"name": "r", "namespace": "ns", "generation": 1}, "status": {}}
    st = S.compute_status(Observed(rl, "progress", [], {}, spec=spec), now=T0)
    assert st["startTime"] == T0
    rl["status"] = st
    f = S.condition(S.compute_status(Observed(rl, "progress", [], {}, spec=spec), now=at(3601))["conditions"],
                    C.COND_FAILED)
    assert (f["status"], f["reason"]) == ("True", "DeadlineExceeded")
    suspended = parse_spec({**_example(), "activeDeadlineSeconds": 3600, "suspend": True})
    st = S.compute_status(Observed(rl, "progress", [], {}, spec=suspended), now=at(3601))
    assert "startTime" not in st and S.condition(st.get("conditions"), C.COND_FAILED) is None


def _example() -> dict:
    return yaml.safe_load((EXAMPLES / "grpo-h100.yaml").read_text())["spec"]
