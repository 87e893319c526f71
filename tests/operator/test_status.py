"""Unit tests of the pure status logic: conditions, phase, progress, drift."""

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
    assert S.phase(both, suspended=False, failed=True) == C.PHASE_FAILED
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
    p, err = S.parse_progress('{"step": 3, "samples": 384, "bogus": 1}')
    assert err is None and p == {"step": 3, "samples": 384}


def test_eta_from_planned_samples_to_target():
    # planned samples-to-target = 600 s x 100 samples/s = 60000; 30000 done at 50/s -> 600 s left
    out = S.progress_status({"samples": 30000, "samplesPerSecond": 50.0}, PLAN, 0.8, 200000)
    assert out["etaSeconds"] == 600.0 and out["timeToTarget"] == "eta 10m00s"
    done = S.progress_status({"targetReached": True, "elapsedSeconds": 252}, PLAN, 0.8, 200000)
    assert done["timeToTarget"] == "4m12s" and done["etaSeconds"] == 0


def test_drift_is_relative_to_the_plan():
    assert S.drift(PLAN, 100.0) == 0
    assert abs(S.drift(PLAN, 70.0) - 0.3) < 1e-9
    assert S.drift(PLAN, None) is None and S.drift({}, 50.0) is None


def test_plan_summary_drops_candidates_and_adds_the_batch_column():
    s = S.plan_summary(PLAN)
    assert "candidates" not in s and s["batch"] == "16x8" and s["rolloutReplicas"] == 2


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
