"""Unit tests of the pure status logic: conditions, phase, progress, the pods' health."""

from __future__ import annotations

from rlscale.operator import constants as C
from rlscale.operator import faults as F
from rlscale.operator import status as S

PLAN = {"prompts": 16, "samplesPerPrompt": 8, "learningRate": 1e-5, "rolloutReplicas": 2,
        "learnerReplicas": 1, "predicted": {"samplesPerSecond": 100.0, "stepSeconds": 1.28, "samplesToTarget": 60000.0,
                                            "timeToTargetSeconds": 600.0}, "reason": "why", "candidates": [1, 2],
        "samplesToTargetKnown": True}


def test_transition_time_moves_only_when_status_flips():
    c = S.set_condition(None, C.COND_PLANNED, True, "A", "m", 1, now="t1")
    c = S.set_condition(c, C.COND_PLANNED, True, "B", "m2", 2, now="t2")
    (p,) = c
    assert p["lastTransitionTime"] == "t1" and p["reason"] == "B" and p["observedGeneration"] == 2
    c = S.set_condition(c, C.COND_PLANNED, False, "C", "m3", 3, now="t3")
    assert c[0]["lastTransitionTime"] == "t3" and c[0]["status"] == "False"


def test_conditions_keep_a_stable_order_and_one_entry_per_type():
    c = S.set_condition(None, C.COND_LEARNERS_READY, True, "r", "m", 1)
    c = S.set_condition(c, C.COND_PLANNED, True, "r", "m", 1)
    c = S.set_condition(c, C.COND_LEARNERS_READY, False, "r", "m", 1)
    assert [x["type"] for x in c] == [C.COND_PLANNED, C.COND_LEARNERS_READY]


def test_phase_from_conditions():
    ready = S.readiness(C.ROLE_ROLLOUT, 2, 2, 1, None)
    assert S.phase(ready, suspended=False) == C.PHASE_PENDING  # learners not ready yet
    both = S.readiness(C.ROLE_LEARNER, 1, 1, 1, ready)
    assert S.phase(both, suspended=False) == C.PHASE_RUNNING
    assert S.phase(both, suspended=True) == C.PHASE_SUSPENDED
    failed = S.set_condition(both, C.COND_FAILED, True, "r", "m", 1)
    assert S.phase(failed, suspended=False) == C.PHASE_FAILED and S.finished({"conditions": failed})
    degraded = S.set_condition(both, C.COND_DEGRADED, True, "r", "m", 1)
    assert S.phase(degraded, suspended=False) == C.PHASE_RUNNING and not S.finished({"conditions": degraded})
    done = S.set_condition(both, C.COND_TARGET_REACHED, True, "r", "m", 1)
    assert S.phase(done, suspended=False) == C.PHASE_SUCCEEDED
    bad = S.set_condition(done, C.COND_INVALID, True, "r", "m", 1)
    assert S.phase(bad, suspended=False) == C.PHASE_FAILED


def test_readiness_messages_and_scaled_to_zero():
    c = S.readiness(C.ROLE_LEARNER, 4, 1, 7, None)
    assert c[0]["status"] == "False" and c[0]["message"] == "1/4 learner ranks ready"
    c = S.readiness(C.ROLE_LEARNER, 0, 0, 7, c)
    assert c[0]["reason"] == "ScaledToZero"


def test_progress_parse_rejects_garbage_with_the_field_named():
    assert S.parse_progress(None) == (None, None)
    p, err = S.parse_progress("{not json")
    assert p is None and C.ANNOTATION_PROGRESS in err
    p, err = S.parse_progress('{"step": 3, "samples": 384, "bogus": 1, "outcome": "Exploded"}')
    assert err is None and p["step"] == 3 and p["samples"] == 384
    assert "bogus" not in p and "outcome" not in p  # unknown keys, and an outcome no version sends
    p, _ = S.parse_progress('{"step": 3, "reward": NaN}')
    assert "reward" not in p  # the API server would refuse a NaN in status


def test_eta_from_planned_samples_to_target():
    # planned samples-to-target 60000 (measured: samplesToTargetKnown); 30000 done at 50/s -> 600 s left
    out = S.progress_status({"samples": 30000, "samplesPerSecond": 50.0}, PLAN, 0.8)
    assert out["etaSeconds"] == 600.0 and out["timeToTarget"] == "eta 10m00s"
    done = S.progress_status({"targetReached": True, "elapsedSeconds": 252}, PLAN, 0.8)
    assert done["timeToTarget"] == "4m12s" and done["etaSeconds"] == 0


def test_no_eta_counts_down_a_placeholder_samples_to_target():
    """A plan whose samples-to-target is the placeholder (never measured for the spec) gives no ETA: the status
    says unknown, and drops an ETA an earlier status carried; the time once the target is reached stays."""
    guess = {**PLAN, "samplesToTargetKnown": False}
    out = S.progress_status({"samples": 30000, "samplesPerSecond": 50.0, "etaSeconds": 12.0}, guess, 0.8)
    assert "etaSeconds" not in out and out["timeToTarget"] == "unknown"
    old = {k: v for k, v in PLAN.items() if k != "samplesToTargetKnown"}  # written before the key: not known
    assert S.progress_status({"samples": 1, "samplesPerSecond": 50.0}, old, 0.8)["timeToTarget"] == "unknown"
    done = S.progress_status({"targetReached": True, "elapsedSeconds": 252}, guess, 0.8)
    assert done["timeToTarget"] == "4m12s" and done["etaSeconds"] == 0


def test_the_last_report_ends_the_run_with_its_outcome_and_figures():
    prog = {"step": 40, "samples": 10240, "targetMetric": 0.51, "timeToTargetSeconds": 190.0,
            "samplesToTarget": 10240, "outcome": "Succeeded", "report": "/checkpoints/report on r-learner-0"}
    conds = S.outcome_conditions([], prog, "eval/accuracy", 0.5, 3)
    (c,) = conds
    assert c["type"] == C.COND_SUCCEEDED and c["status"] == "True"
    assert "10240 samples" in c["message"] and "3m10s" in c["message"] and "r-learner-0" in c["message"]
    assert S.finished({"conditions": conds}) and S.phase(conds, suspended=False) == C.PHASE_SUCCEEDED
    spent = S.outcome_conditions([], {**prog, "outcome": "BudgetExhausted"}, "eval/accuracy", 0.9, 3)
    assert S.phase(spent, suspended=False) == C.PHASE_BUDGET_EXHAUSTED and S.finished({"conditions": spent})
    # A report without an outcome (the run goes on) ends nothing.
    assert S.outcome_conditions([], {"step": 3}, "eval/accuracy", 0.5, 1) == []
    assert not S.finished({"conditions": []})


def test_every_phase_the_operator_writes_is_one_the_crd_accepts():
    # The API server refused a BudgetExhausted phase (422) while the CRD's enum lacked it.
    from rlscale.crd import PHASES

    written = {v for k, v in vars(C).items() if k.startswith("PHASE_")}
    assert written == set(PHASES)


def pod(name, role, statuses=(), init=(), conditions=()):
    return {"metadata": {"name": name, "labels": {C.LABEL_RUN: "r", C.LABEL_ROLE: role}},
            "status": {"containerStatuses": list(statuses), "initContainerStatuses": list(init),
                       "conditions": list(conditions)}}


def crashing(restarts, reason="Error", code=1, message="Traceback\n  File x\nImportError: no module named rewardz\n"):
    return {"name": "learner", "restartCount": restarts,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
            "lastState": {"terminated": {"exitCode": code, "reason": reason, "message": message,
                                         "finishedAt": "2026-12-01T03:00:00Z"}}}


RUNNING = {"name": "rollout", "restartCount": 0, "state": {"running": {}}}


def test_a_crash_loop_is_degraded_with_the_exit_and_the_log_tail():
    pods = [pod("r-learner-0", C.ROLE_LEARNER, [crashing(2)]), pod("r-rollout-x", C.ROLE_ROLLOUT, [RUNNING])]
    conds = S.health_conditions(None, pods, backoff_limit=4, generation=3)
    d = S.condition(conds, C.COND_DEGRADED)
    assert d["status"] == "True" and d["reason"] == "LearnerCrashLoopBackOff"
    assert "r-learner-0" in d["message"] and "after 2 restarts" in d["message"] and "last exit 1" in d["message"]
    assert "ImportError: no module named rewardz" in d["message"]
    assert S.condition(conds, C.COND_FAILED) is None


def test_faults_past_the_backoff_limit_fail_the_run_quoting_the_last_exit():
    pods = [pod("r-learner-0", C.ROLE_LEARNER, [crashing(3)]), pod("r-learner-1", C.ROLE_LEARNER, [crashing(2)])]
    faults = F.advance(None, pods, 7, 50, T0)
    assert faults["count"] == 4  # r-learner-0's 3 restarts; r-learner-1's first is one of them, its second not
    conds = S.health_conditions(None, pods, backoff_limit=3, generation=3, faults=faults)
    f = S.condition(conds, C.COND_FAILED)
    assert f["status"] == "True" and f["reason"] == "BackoffLimitExceeded"
    assert "4 faults (restarts of the learner pods" in f["message"]
    assert "exceed spec.failurePolicy.backoffLimit (3)" in f["message"]
    assert "ImportError" in f["message"] and S.phase(conds, False) == C.PHASE_FAILED
    assert S.condition(S.health_conditions(None, pods, 4, 3, faults=faults), C.COND_FAILED) is None


# ---------------------------------------------------------------- the failure budget (operator/faults.py)

T0 = "2026-12-01T03:00:00Z"


def at(seconds: int) -> str:
    import datetime as dt

    return (dt.datetime(2026, 12, 1, 3, tzinfo=dt.UTC) + dt.timedelta(seconds=seconds)).isoformat().replace(
        "+00:00", "Z")


def learners(restarts, n=8, **kw):
    return [pod(f"r-learner-{i}", C.ROLE_LEARNER, [dict(RUNNING, name="learner", restartCount=restarts)], **kw)
            for i in range(n)]


def test_a_gang_restart_of_eight_ranks_is_one_fault():
    rec = F.advance(None, learners(0), 40, 50, T0)
    assert rec == {}  # nothing to keep while nothing restarted
    # The ranks' restarts come in over several passes, within the window.
    for i, t in enumerate((5, 6, 6, 9, 12, 30, 31, 60)):
        pods = learners(1, n=i + 1) + learners(0)[i + 1:]
        rec = F.advance(rec, pods, 40, 50, at(t))
    assert rec["count"] == 1 and rec["lastFaultStep"] == 40 and rec["lastRole"] == C.ROLE_LEARNER
    assert len(rec["windowPods"]) == 8
    assert not F.exceeded(rec, 4) and F.advance(rec, learners(1), 40, 50, at(90)) == rec  # nothing new: as it was
    # Seen all at once too (the operator was away).
    assert F.advance(None, learners(1), 40, 50, T0)["count"] == 1
    # A later gang restart, past the window, is the second fault.
    assert F.advance(rec, learners(2), 41, 50, at(F.WINDOW_SECONDS + 10))["count"] == 2


def test_a_pod_crash_looping_counts_every_restart():
    rec: dict = {}
    for k in range(1, 6):  # the kubelet's back-off: 10 s, 20 s, 40 s, ...
        rec = F.advance(rec, [pod("r-learner-0", C.ROLE_LEARNER, [crashing(k)])], 12, 50, at(10 * 2 ** k))
    assert rec["count"] == 5 and F.exceeded(rec, 4)
    # Another pod's restart in the window joins the fault; the same pod's again is a new one.
    rec = F.advance(rec, [pod("r-learner-0", C.ROLE_LEARNER, [crashing(5)]),
                          pod("r-learner-1", C.ROLE_LEARNER, [crashing(1)])], 12, 50, at(330))
    assert rec["count"] == 5


def test_faults_are_forgiven_after_checkpoint_every_steps_of_progress():
    rec = F.advance(None, learners(1), 140, 50, T0)
    rec = F.advance(rec, learners(2), 141, 50, at(400))
    assert (rec["count"], rec["lastFaultStep"]) == (2, 141)
    # It resumed from the checkpoint at 100: 189 steps is not yet 50 past the fault.
    assert F.advance(rec, learners(2), 189, 50, at(900))["count"] == 2
    rec = F.advance(rec, learners(2), 191, 50, at(1000))
    assert rec["count"] == 0 and rec["restarts"]["r-learner-0"] == 2  # the restarts seen stay the baseline
    assert F.advance(rec, learners(3), 192, 50, at(1100))["count"] == 1
    # checkpoint.every is at least one step
    assert F.advance(F.advance(None, learners(1), 5, 0, T0), learners(1), 6, 0, at(10))["count"] == 0


def test_init_container_restarts_count_before_the_first_step_only():
    model = {"name": "model", "restartCount": 1, "state": {"terminated": {"exitCode": 2, "reason": "Error"}}}
    before = [pod("r-learner-0", C.ROLE_LEARNER, [dict(RUNNING, restartCount=0)], init=[model])]
    rec = F.advance(None, before, None, 50, T0)
    assert rec["count"] == 1 and "lastFaultStep" not in rec  # before any step
    rec = F.advance(rec, [pod("r-learner-0", C.ROLE_LEARNER, [RUNNING], init=[dict(model, restartCount=2)])],
                    None, 50, at(20))
    assert rec["count"] == 2 and F.exceeded(rec, 1)
    # Once the run has stepped, an init container's restart is not a fault.
    rec = F.advance(None, before, 3, 50, T0)
    assert rec == {}
    assert F.advance(rec, [pod("r-learner-0", C.ROLE_LEARNER, [RUNNING], init=[dict(model, restartCount=4)])],
                     4, 50, at(300)) == {}


def test_a_recreated_pod_is_no_restart():
    rec = F.advance(None, learners(3, n=1), 10, 50, T0)
    assert rec["count"] == 3
    # The StatefulSet recreated it under its name: fewer restarts, a new baseline.
    rec = F.advance(rec, learners(1, n=1), 10, 50, at(600))
    assert rec["count"] == 3 and rec["restarts"] == {"r-learner-0": 1}
    assert F.advance(rec, learners(2, n=1), 10, 50, at(900))["count"] == 4
    # A new uid under the old name counts from 0; a pod gone leaves the record.
    old = [dict(p, metadata={**p["metadata"], "uid": "a"}) for p in learners(2, n=1)]
    new = [dict(p, metadata={**p["metadata"], "uid": "b"}) for p in learners(2, n=1)]
    rec = F.advance(None, old, 10, 50, T0)
    assert rec["count"] == 2 and rec["uids"] == {"r-learner-0": "a"}
    assert F.advance(rec, new, 10, 50, at(1000))["count"] == 4
    assert F.advance(rec, [], 10, 50, at(1000)).get("restarts") is None


def test_the_fault_record_round_trips_through_status():
    import json

    from rlscale.operator.observed import Observed
    from rlscale.spec import parse_spec

    spec = parse_spec({"model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"}, "checkpoint": {"every": 20},
                       "failurePolicy": {"backoffLimit": 2}})
    rl = {"metadata": {"name": "r", "namespace": "ns", "generation": 1}, "status": {"progress": {"step": 30}}}
    st = S.compute_status(Observed(rl, "pod", learners(1), {}, spec=spec), now=T0)
    assert st["faults"]["count"] == 1 and st["faults"]["lastFaultStep"] == 30
    assert S.condition(st["conditions"], C.COND_FAILED) is None
    rl = json.loads(json.dumps({**rl, "status": st}))  # as the API server keeps it
    assert S.compute_status(Observed(rl, "pod", learners(1), {}, spec=spec), now=at(60)) == st  # nothing new
    for k, t in ((2, 400), (3, 800)):
        rl["status"] = S.compute_status(Observed(rl, "pod", learners(k), {}, spec=spec), now=at(t))
    f = S.condition(rl["status"]["conditions"], C.COND_FAILED)
    assert rl["status"]["faults"]["count"] == 3 and f["reason"] == "BackoffLimitExceeded"
    assert "spec.failurePolicy.backoffLimit (2)" in f["message"] and rl["status"]["phase"] == C.PHASE_FAILED


def test_oom_image_pull_and_unschedulable_are_named():
    oom = pod("r-rollout-a", C.ROLE_ROLLOUT, [crashing(1, reason="OOMKilled", code=137, message="")])
    pull = pod("r-rollout-b", C.ROLE_ROLLOUT, [{"name": "rollout", "restartCount": 0, "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": 'Back-off pulling image "acme/rollout:nope"'}}}])
    pending = pod("r-learner-0", C.ROLE_LEARNER, conditions=[{"type": "PodScheduled", "status": "False",
                  "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}])
    assert (S.pod_problems(oom)[0]["reason"] == "OOMKilled"
            and "exit 137 (OOMKilled)" in S.pod_problems(oom)[0]["message"])
    assert 'acme/rollout:nope' in S.pod_problems(pull)[0]["message"]
    (u,) = S.pod_problems(pending)
    assert u["reason"] == "Unschedulable" and "Insufficient nvidia.com/gpu" in u["message"]
    conds = S.health_conditions(None, [pending], backoff_limit=4, generation=1)
    assert S.condition(conds, C.COND_DEGRADED)["reason"] == "LearnerUnschedulable"


def test_rollout_pods_no_node_fits_while_fewer_replicas_serve_than_planned_is_waiting_for_capacity():
    unplaced = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}
    pods = [pod("r-rollout-a", C.ROLE_ROLLOUT, [RUNNING]), pod("r-rollout-b", C.ROLE_ROLLOUT, conditions=[unplaced]),
            pod("r-rollout-c", C.ROLE_ROLLOUT, conditions=[unplaced])]
    d = S.condition(S.health_conditions(None, pods, 4, 1, serving=(1, 3)), C.COND_DEGRADED)
    assert (d["status"], d["reason"]) == ("True", "WaitingForCapacity")
    assert d["message"].startswith("the driver trains with 1 of 3 planned rollout replicas: 2 rollout pods cannot be")
    # Every replica serves (a pod replaced by a roll waits, say), or the driver does not say: as before.
    for serving in ((3, 3), None):
        d = S.condition(S.health_conditions(None, pods, 4, 1, serving=serving), C.COND_DEGRADED)
        assert d["reason"] == "RolloutUnschedulable"
    # A learner failing as well: not a matter of capacity; the pods' problems as before.
    worse = [*pods, pod("r-learner-0", C.ROLE_LEARNER, [crashing(2)])]
    d = S.condition(S.health_conditions(None, worse, 4, 1, serving=(1, 3)), C.COND_DEGRADED)
    assert d["reason"] == "RolloutUnschedulable" and "(and 2 more)" in d["message"]


def test_degraded_clears_when_the_pods_recover():
    conds = S.health_conditions(None, [pod("r-learner-0", C.ROLE_LEARNER, [crashing(1)])], 4, 1)
    ok = dict(crashing(1), state={"running": {}})
    conds = S.health_conditions(conds, [pod("r-learner-0", C.ROLE_LEARNER, [ok])], 4, 1)
    d = S.condition(conds, C.COND_DEGRADED)
    assert d["status"] == "False" and d["reason"] == "Healthy"
    assert S.health_conditions(None, [pod("r-rollout-a", C.ROLE_ROLLOUT, [RUNNING])], 4, 1) == []


def test_a_permanent_driver_failure_ends_the_run_with_its_message():
    prog = {"step": 12, "samples": 1536, "failed": True, "outcome": "Failed",
            "message": "ModuleNotFoundError: No module named 'mypkg'"}
    conds = S.outcome_conditions(None, prog, "eval/accuracy", 0.8, 4)
    f = S.condition(conds, C.COND_FAILED)
    assert f["status"] == "True" and f["reason"] == "DriverFailed"
    assert "stopped at step 12: ModuleNotFoundError: No module named 'mypkg'" in f["message"]
    assert S.finished({"conditions": conds}) and S.phase(conds, False) == C.PHASE_FAILED


def test_a_container_that_just_exited_with_an_error_is_degraded_before_any_back_off():
    exited = {"name": "model", "restartCount": 1, "state": {"terminated": {
        "exitCode": 2, "reason": "Error",
        "message": "rlscale prepare-model: spec.model.path: 'acme/x' is not in the cache\n"}}}
    conds = S.health_conditions(None, [pod("r-learner-0", C.ROLE_LEARNER, init=[exited])], 4, 1)
    d = S.condition(conds, C.COND_DEGRADED)
    assert d["status"] == "True" and d["reason"] == "LearnerExitedWithError"
    assert "exited 2 (Error) after 1 restarts: rlscale prepare-model: spec.model.path: 'acme/x'" in d["message"]
    # A pod being deleted (scale-down, suspend) is not a failure, whatever its exit code.
    going = pod("r-learner-0", C.ROLE_LEARNER, [dict(exited, restartCount=0)])
    going["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    assert S.pod_problems(going) == []
    # Completed with 0 (the rollout pod at the end of a run) is fine.
    done = {"name": "rollout", "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
    assert S.pod_problems(pod("r-rollout-a", C.ROLE_ROLLOUT, [done])) == []


def test_a_progress_report_is_folded_into_status_unless_it_is_stale():
    import json

    import yaml

    from rlscale.operator.observed import Observed
    from rlscale.spec import parse_spec
    from tests.conftest import EXAMPLES

    spec = parse_spec(yaml.safe_load((EXAMPLES / "quickstart-k8s.yaml").read_text())["spec"])
    prog = {"step": 40, "samples": 5120, "targetMetric": 0.49, "targetReached": True, "elapsedSeconds": 39.0,
            "samplesPerSecond": 130.0, "measurements": {"step": 40}}
    rl = {"metadata": {"generation": 3, "annotations": {C.ANNOTATION_PROGRESS: json.dumps(prog)}},
          "status": {"plan": {"prompts": 16, "samplesPerPrompt": 8}, "startTime": "t0"}}
    st = S.compute_status(Observed(rl, "progress", [], {}, spec=spec, report=prog), now="t")
    assert st["progress"]["step"] == 40 and "measurements" not in st["progress"]  # the re-planner's input
    reached = {c["type"]: c for c in st["conditions"]}[C.COND_TARGET_REACHED]
    assert reached["status"] == "True" and "0.49" in reached["message"] and reached["observedGeneration"] == 3
    # A pass that has no current report (a stale one dropped) leaves progress as it was.
    assert S.compute_status(Observed(rl, "progress", [], {}, spec=spec), now="t") == rl["status"]
