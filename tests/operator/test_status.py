"""Unit tests of the pure status logic: conditions, phase, progress, the pods' health."""

from __future__ import annotations

from rlscale.operator import constants as C
from rlscale.operator import status as S

PLAN = {"prompts": 16, "samplesPerPrompt": 8, "learningRate": 1e-5, "rolloutReplicas": 2,
        "learnerReplicas": 1, "predicted": {"samplesPerSecond": 100.0, "stepSeconds": 1.28,
                                            "timeToTargetSeconds": 600.0}, "reason": "why", "candidates": [1, 2]}


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
    # planned samples-to-target = 600 s x 100 samples/s = 60000; 30000 done at 50/s -> 600 s left
    out = S.progress_status({"samples": 30000, "samplesPerSecond": 50.0}, PLAN, 0.8, 200000)
    assert out["etaSeconds"] == 600.0 and out["timeToTarget"] == "eta 10m00s"
    done = S.progress_status({"targetReached": True, "elapsedSeconds": 252}, PLAN, 0.8, 200000)
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


def test_restarts_past_the_backoff_limit_fail_the_run_quoting_the_last_exit():
    pods = [pod("r-learner-0", C.ROLE_LEARNER, [crashing(3)]), pod("r-learner-1", C.ROLE_LEARNER, [crashing(2)])]
    conds = S.health_conditions(None, pods, backoff_limit=4, generation=3)
    f = S.condition(conds, C.COND_FAILED)
    assert f["status"] == "True" and f["reason"] == "BackoffLimitExceeded"
    assert "5 container restarts of the learner pods exceed spec.failurePolicy.backoffLimit (4)" in f["message"]
    assert "ImportError" in f["message"] and S.phase(conds, False) == C.PHASE_FAILED


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
          "status": {"plan": {"prompts": 16, "samplesPerPrompt": 8}}}
    st = S.compute_status(Observed(rl, "progress", [], {}, spec=spec, report=prog), now="t")
    assert st["progress"]["step"] == 40 and "measurements" not in st["progress"]  # the re-planner's input
    reached = {c["type"]: c for c in st["conditions"]}[C.COND_TARGET_REACHED]
    assert reached["status"] == "True" and "0.49" in reached["message"] and reached["observedGeneration"] == 3
    # A pass that has no current report (a stale one dropped) leaves progress as it was.
    assert S.compute_status(Observed(rl, "progress", [], {}, spec=spec), now="t") == rl["status"]
