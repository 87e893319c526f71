"""The one re-planner (the driver's on one machine, the operator's in a cluster): measured throughput
wins over the one-point calibrated model, a change waits for a second re-plan that agrees, and the
learner count stays."""

import pytest

from rlscale.plan import Calibration, Phases, Prediction, make_plan
from rlscale.plan.decision import Candidate
from rlscale.plan.replan import (
    REPLAN_EVERY,
    REPLAN_WARMUP_STEPS,
    Limits,
    Measurements,
    ReplanState,
    choose,
    due,
    keep_learners,
    measured_throughput,
    replan,
)
from rlscale.records import StepRecord
from rlscale.spec import load_rlrun, parse_spec
from tests.conftest import EXAMPLES


def cand(prompts: int, e: float, t: float, rollout: int = 1, spp: int = 8, eval_s: float = 0.0) -> Candidate:
    pred = Prediction(samples_per_second=1.0, step_seconds=1.0, time_to_target_seconds=t, samples_to_target=e,
                      phases=Phases(1, 0, 0, 0), eval_seconds_per_step=eval_s)
    return Candidate(prompts, spp, rollout, 1, 1e-4, 0, pred, 1.0, 1.0, 1, "memory")


def test_unmeasured_configurations_are_judged_by_the_model():
    best, best_t, cur_t = choose([cand(8, 100_000, 400), cand(16, 110_000, 500)], {}, (16, 1))
    assert best.prompts == 8 and (best_t, cur_t) == (400, 500)


def test_a_tried_configuration_is_judged_by_what_it_measured():
    # The model says 8 prompts is faster, but 8 prompts ran at 200 samples/s: 100k / 200 = 500 s,
    # while 16 prompts measured 275 samples/s: 110k / 275 = 400 s.
    cands = [cand(8, 100_000, 400), cand(16, 110_000, 500)]
    best, best_t, cur_t = choose(cands, {(8, 1): 200.0, (16, 1): 275.0}, (16, 1))
    assert best.prompts == 16 and best_t == cur_t == 400


def test_unknown_current_configuration_never_blocks_a_choice():
    best, _, cur_t = choose([cand(8, 1, 2)], {}, (64, 1))
    assert best.prompts == 8 and cur_t == float("inf")


def test_a_change_waits_for_a_second_re_plan_that_agrees():
    s = ReplanState()
    s, ok = s.propose((8, 1), 25)
    assert not ok  # first sighting: wait
    s, ok = s.propose((8, 1), 50)
    assert ok  # the next re-plan agrees: apply
    s, ok = s.propose((8, 1), 75)
    assert not ok  # applied; a new streak starts


def test_flapping_proposals_never_pass_the_gate():
    # What a noisy noise-scale estimate did before the gate: 8, 32, 8, 32, ... prompts.
    s, oks = ReplanState(), []
    for i in range(20):
        s, ok = s.propose((8 if i % 2 else 32, 1), i)
        oks.append(ok)
    assert not any(oks)
    # A re-plan that keeps the current configuration breaks a streak.
    s = ReplanState()
    s, a = s.propose((8, 1), 1)
    s, b = s.propose(None, 2)
    s, c = s.propose((8, 1), 3)
    assert not (a or b or c)


def test_the_gate_survives_a_round_trip_through_status():
    s, _ = ReplanState().propose((8, 2), 50)
    assert ReplanState.from_dict(s.to_dict()) == s and ReplanState.from_dict(None) == ReplanState()


def test_a_measured_configuration_also_pays_its_evals():
    # 100k samples at 250 samples/s is 400 s of steps; at 128 samples a step that is 781 steps,
    # each carrying 0.06 s of evals: 447 s. At 256 samples a step the evals cost half as much.
    small, large = cand(16, 100_000, 0, eval_s=0.06), cand(32, 100_000, 0, eval_s=0.06)
    _, t_large, t_small = choose([small, large], {(16, 1): 250.0, (32, 1): 250.0}, (16, 1))
    assert t_small == pytest.approx(400 + 100_000 / 128 * 0.06)
    assert t_large == pytest.approx(400 + 100_000 / 256 * 0.06)


def test_re_plans_come_at_each_multiple_of_the_interval_past_the_warm_up():
    s = ReplanState()
    fired = [step for step in range(1, 80) if due(step, s) and (s := ReplanState(step))]
    assert fired == [REPLAN_EVERY, 2 * REPLAN_EVERY, 3 * REPLAN_EVERY] and REPLAN_WARMUP_STEPS < REPLAN_EVERY
    # The operator sees reports at whatever steps they reach it: the first one past a multiple fires.
    assert due(53, ReplanState(27)) and not due(49, ReplanState(27))


def records(prompts: int, sps: float, n: int, start: int = 1, rollout: int = 1) -> list[StepRecord]:
    step_s = prompts * 8 / sps
    return [StepRecord(step=start + i, samples=(start + i) * prompts * 8, batch_samples=prompts * 8, prompts=prompts,
                       samples_per_prompt=8, rollout_replicas=rollout, learner_replicas=1, step_seconds=step_s,
                       samples_per_second=sps, generated_tokens=prompts * 8 * 4,
                       phases={"generate": 0.45 * step_s, "reward": 0.01 * step_s, "train": 0.5 * step_s,
                               "sync": 0.04 * step_s}) for i in range(n)]


def test_measurements_round_trip_and_name_their_configuration():
    recs = records(16, 200.0, 30) + records(32, 300.0, 30, start=31)
    m = Measurements.from_records(recs)
    assert m.step == 60 and m.throughput == {(16, 1): 200.0, (32, 1): 300.0}
    assert (m.calibration.prompts, m.calibration.samples_per_prompt) == (32, 8)  # the latest configuration
    back = Measurements.from_dict(m.to_dict())
    assert back.throughput == m.throughput and back.calibration.train_s == pytest.approx(m.calibration.train_s)
    assert measured_throughput(records(8, 100.0, 9)) == {}  # too few steps to count


def test_keep_learners_pins_an_auto_count_and_leaves_a_fixed_one():
    spec = load_rlrun(EXAMPLES / "quickstart.yaml").spec
    assert keep_learners(spec, 1).learner.replicas == 1
    fixed = parse_spec({"hardware": {"accelerator": "cpu"}, "learner": {"replicas": 2}})
    assert keep_learners(fixed, 1).learner.replicas == 2


def test_a_clearly_faster_measured_configuration_is_switched_to_after_two_re_plans():
    spec = load_rlrun(EXAMPLES / "quickstart.yaml").spec  # prompts auto in [8, 32]
    current = make_plan(spec)
    # The current configuration measured slow; another one, tried earlier, measured 3x as fast.
    other = next(p for p in (8, 16, 32) if p != current.prompts)
    slow = records(current.prompts, 60.0, 40, start=1)
    fast = records(other, 180.0, 40, start=41)
    recs = fast + [StepRecord(**{**r.__dict__, "step": 80 + i}) for i, r in enumerate(slow[:20], 1)]
    m1 = Measurements.from_records(recs[:-5])  # step 95: no multiple of 25 crossed since 75
    state = ReplanState(last_step=75)
    assert replan(spec, current, m1, state) is None
    first = replan(spec, current, Measurements.from_records(recs), state)  # step 100
    assert first is not None and not first.switched and "applied if the next re-plan agrees" in first.message
    assert first.plan.key == current.key and first.plan.calibrated
    later = recs + [StepRecord(**{**r.__dict__, "step": 100 + i}) for i, r in enumerate(slow[:25], 1)]
    second = replan(spec, current, Measurements.from_records(later), first.state)
    assert second is not None and second.switched, second.message
    assert second.plan.prompts == other and second.plan.learner_replicas == current.learner_replicas
    assert second.plan.reason == second.message and "measured" in second.message


def test_a_re_plan_that_finds_nothing_better_keeps_the_plan_with_a_recalibrated_prediction():
    spec = load_rlrun(EXAMPLES / "quickstart.yaml").spec
    current = make_plan(spec)
    recs = records(current.prompts, 250.0, 25)
    d = replan(spec, current, Measurements.from_records(recs), ReplanState())
    assert d is not None and not d.switched and d.plan.key == current.key
    assert d.plan.predicted.step_seconds == pytest.approx(current.prompts * 8 / 250.0, rel=0.05)
    assert Calibration.from_dict(Measurements.from_records(recs).calibration.to_dict()) is not None


def test_a_re_plan_keeps_the_running_placement():
    # The re-planner passes the running plan's placement to make_plan: moving the engines onto (or off)
    # the learner's devices is a new deployment, not a re-plan. Either placement stays put.
    d = load_rlrun(EXAMPLES / "quickstart.yaml").spec.model_dump(by_alias=True)
    d["rollout"]["replicas"] = "auto"
    spec = parse_spec({**d, "placement": "auto"})
    for where in ("colocated", "disaggregated"):
        current = make_plan(spec, placement=where)
        assert current.placement == where
        recs = records(current.prompts, 250.0, 25)
        decision = replan(spec, current, Measurements.from_records(recs), ReplanState())
        assert decision is not None and decision.plan.placement == where
        assert all(c.placement == where for c in make_plan(spec, None, where).candidates)


def test_a_rollout_pod_limit_does_not_bind_colocated_engines():
    d = load_rlrun(EXAMPLES / "quickstart.yaml").spec.model_dump(by_alias=True)
    d["rollout"]["replicas"] = "auto"
    d["learner"].update(replicas=2, maxReplicas=2)
    spec = parse_spec({**d, "placement": "colocated"})
    current = make_plan(spec)
    assert (current.placement, current.rollout_replicas, current.learner_replicas) == ("colocated", 2, 2)
    decision = replan(spec, current, Measurements.from_records(records(current.prompts, 250.0, 25)), ReplanState(),
                      Limits(rollout=1))
    assert decision is not None and decision.plan.rollout_replicas == 2 and "no candidate" not in decision.message
