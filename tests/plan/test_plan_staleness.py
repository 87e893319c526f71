"""Bounded staleness in the planner: the overlapped step, the samples penalty (1 + p)^K, the choice of K
with the batch and its words, colocated and cpu at 0, pins, the re-planner changing K alone."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from rlscale.cli import app
from rlscale.plan import Calibration, Phases, Plan, Prediction, make_plan
from rlscale.plan.decision import Candidate
from rlscale.plan.replan import Measurements, ReplanState, choose, replan
from rlscale.plan.staleness import (
    DEFAULT_STALENESS_PENALTY,
    overlapped_step,
    staleness_options,
    staleness_penalty,
)
from rlscale.spec import load_rlrun
from rlscale.sweep.patch import calibration_from
from tests.conftest import EXAMPLES


def h100(**algorithm) -> object:
    """examples/grpo-h100.yaml (Qwen2.5-7B on 16 H100: training 8.8 s beside 4.1 s of generation at 64x8)."""
    spec = load_rlrun(EXAMPLES / "grpo-h100.yaml").spec.model_copy(deep=True)
    for k, v in algorithm.items():
        setattr(spec.algorithm, k, v)
    return spec


def fixed(spec, prompts=64, rollout=8):
    """The spec with the batch and the rollout replicas fixed, so that only the staleness is left to choose."""
    s = spec.model_copy(deep=True)
    s.batch.prompts, s.rollout.replicas = prompts, rollout
    return s


def test_the_overlapped_step_is_the_longer_side_plus_what_cannot_overlap():
    assert overlapped_step(2.0, 0.1, 3.0, 0.5, 0) == pytest.approx(5.6)  # the synchronous sum
    assert overlapped_step(2.0, 0.1, 3.0, 0.5, 1) == pytest.approx(3.5)  # train hides generation
    assert overlapped_step(4.0, 0.1, 3.0, 0.5, 2) == pytest.approx(4.6)  # generation hides train
    assert Phases(2.0, 0.1, 3.0, 0.5).step(1) == pytest.approx(3.5) and Phases(2.0, 0.1, 3.0, 0.5).total == 5.6


def test_the_penalty_compounds_per_step_and_never_rewards():
    assert staleness_penalty(0, 0.1) == 1.0
    assert staleness_penalty(2, 0.1) == pytest.approx(1.21)
    assert staleness_penalty(3, -0.2) == 1.0  # a negative p is read as 0


def test_staleness_is_chosen_when_its_throughput_gain_beats_the_penalty():
    plan = make_plan(h100(max_staleness=2))
    assert plan.staleness == 1  # past 1 the model sees no more overlap, only more penalty
    assert plan.predicted.staleness == 1
    assert "Staleness 1 (maxStaleness 2): throughput x" in plan.reason
    assert "> samples penalty x1.05 against the synchronous loop" in plan.reason
    assert "p the default, not measured" in plan.reason
    same = {c.staleness: c for c in plan.candidates if (c.prompts, c.rollout_replicas, c.learner_replicas)
            == (plan.prompts, plan.rollout_replicas, plan.learner_replicas)}
    if 0 in same:  # the E ratio is the penalty, the step the overlapped one
        assert same[1].predicted.samples_to_target / same[0].predicted.samples_to_target == pytest.approx(1.05)
    ph = plan.predicted.phases
    assert plan.predicted.step_seconds == pytest.approx(max(ph.generate + ph.reward, ph.train) + ph.sync)
    assert {c.staleness for c in plan.candidates} == {0, 1, 2}


def test_staleness_is_kept_at_zero_when_the_penalty_exceeds_the_gain():
    plan = make_plan(fixed(h100(max_staleness=1)), Calibration(staleness_penalty=1.0))
    assert plan.staleness == 0
    assert "Staleness 0 (maxStaleness 1): staleness 1 gains throughput x" in plan.reason
    assert "< samples penalty x2.00" in plan.reason and "p measured by a sweep" in plan.reason


def test_max_staleness_zero_plans_as_before():
    base = make_plan(h100())
    assert base.staleness == 0 and "Staleness" not in base.reason
    assert all(c.staleness == 0 and c.predicted.staleness == 0 for c in base.candidates)
    ph = base.predicted.phases
    assert base.predicted.step_seconds == pytest.approx(ph.total)


def test_colocated_engines_never_run_ahead():
    spec = h100(max_staleness=2)
    assert staleness_options(spec, "colocated") == [0]
    plan = make_plan(spec, placement="colocated")
    assert plan.placement == "colocated" and plan.staleness == 0
    assert "the colocated engines sleep while the learner trains, so nothing overlaps" in plan.reason
    assert {c.staleness for c in plan.candidates} == {0}


def test_a_cpu_host_overlaps_on_cores_of_its_own():
    spec = load_rlrun(EXAMPLES / "quickstart.yaml").spec.model_copy(deep=True)
    before = make_plan(spec)
    spec.algorithm.max_staleness = 2
    plan = make_plan(spec)
    # running ahead hides generation behind training: more throughput than (1 + 0.05)^1 costs in samples
    assert plan.staleness == 1 and plan.predicted.step_seconds < before.predicted.step_seconds / 1.05
    assert "each on its own cores" in plan.reason
    spec.placement = "colocated"
    spec.rollout.replicas = "auto"
    assert make_plan(spec).staleness == 0


def test_a_pin_plans_that_staleness_only():
    spec = h100(max_staleness=2)
    plan = make_plan(spec, staleness=2)
    assert plan.staleness == 2 and "pinned by the caller" in plan.reason
    assert make_plan(spec).staleness == 1  # unpinned: the planner's choice
    assert make_plan(h100(), staleness=3).staleness == 0  # never above maxStaleness


def test_staleness_survives_the_round_trip():
    plan = make_plan(h100(max_staleness=1))
    again = Plan.from_dict(plan.to_dict())
    assert again.staleness == plan.staleness == 1 and again.predicted.staleness == 1
    assert [c.staleness for c in again.candidates] == [c.staleness for c in plan.candidates]
    assert plan.to_dict(candidates=False)["staleness"] == 1
    assert plan.replan_key == (plan.prompts, plan.rollout_replicas, 1)
    assert make_plan(h100()).replan_key == make_plan(h100()).key  # unchanged without staleness


def cand(k: int, sps: float, e: float = 100_000.0) -> Candidate:
    pred = Prediction(samples_per_second=sps, step_seconds=64 / sps, time_to_target_seconds=e / sps,
                      samples_to_target=e, phases=Phases(1, 0, 1, 0), staleness=k)
    return Candidate(8, 8, 1, 1, 1e-4, 0, pred, 1.0, 1.0, 1, "memory", staleness=k)


def test_a_measured_rate_moves_to_another_staleness_by_the_models_ratio():
    sync, ahead = cand(0, 100.0), cand(1, 150.0, 105_000.0)
    best, best_t, cur_t = choose([sync, ahead], {(8, 1): 50.0}, (8, 1), staleness=0)
    assert cur_t == pytest.approx(100_000 / 50)  # measured at staleness 0
    assert best is ahead and best_t == pytest.approx(105_000 / 75)  # 50 x 150 / 100
    # measured while running ahead: the synchronous loop is judged at 50 x 100 / 150
    _, _, cur_t = choose([sync, ahead], {(8, 1): 50.0}, (8, 1), staleness=1)
    assert cur_t == pytest.approx(105_000 / 50)


def test_the_replanner_may_change_the_staleness_alone():
    spec = fixed(h100(max_staleness=1))
    current = make_plan(spec, staleness=0)
    assert current.staleness == 0
    m = Measurements(step=25, calibration=Calibration(), throughput={})
    first = replan(spec, current, m, ReplanState())
    assert first is not None and not first.switched and "at staleness 1 looks" in first.message
    assert first.state.proposal == (current.prompts, current.rollout_replicas, 1)
    assert ReplanState.from_dict(first.state.to_dict()) == first.state
    second = replan(spec, first.plan, Measurements(step=50, calibration=Calibration(), throughput={}), first.state)
    assert second is not None and second.switched
    assert second.plan.staleness == 1 and second.plan.key == current.key
    assert second.plan.replan_key != current.replan_key
    assert "at staleness 1" in second.message


def test_a_pinned_replan_keeps_the_pin_and_predicts_the_step_at_it():
    # Unpinned, this spec's re-planner moves to staleness 1 (the test above); pinned at 0 it never does,
    # and the plan's predicted step stays the synchronous one the run measures, not the overlapped one.
    spec = fixed(h100(max_staleness=1))
    current = make_plan(spec, staleness=0)
    state, plan = ReplanState(), current
    for step in (25, 50, 75):
        d = replan(spec, plan, Measurements(step=step, calibration=Calibration(), throughput={}), state,
                   staleness=0)
        assert d is not None and not d.switched and "staleness 1" not in d.message
        state, plan = d.state, d.plan
    assert plan.staleness == 0 and plan.predicted.staleness == 0
    ahead = make_plan(spec, staleness=1).predicted.step_seconds
    assert plan.predicted.step_seconds == pytest.approx(current.predicted.step_seconds)
    assert plan.predicted.step_seconds > ahead * 1.05


def test_the_calibration_carries_the_penalty():
    cal = Calibration(staleness_penalty=0.0)
    assert Calibration.from_dict(cal.to_dict()) == cal  # 0 is a measurement too
    assert Calibration.from_dict({"stalenessPenalty": 0.12}).staleness_penalty == 0.12
    assert calibration_from({"stalenessPenalty": 0.0}, "cal.yaml").staleness_penalty == 0.0
    with pytest.raises(Exception, match="stalenessPenalty"):
        calibration_from({"stalenessPenalty": -0.1}, "cal.yaml")
    assert DEFAULT_STALENESS_PENALTY == 0.05


def test_plan_command_shows_the_staleness(tmp_path):
    d = yaml.safe_load((EXAMPLES / "grpo-h100.yaml").read_text())
    d["spec"]["algorithm"]["maxStaleness"] = 2
    f = tmp_path / "stale.yaml"
    f.write_text(yaml.safe_dump(d))
    runner = CliRunner()
    r = runner.invoke(app, ["plan", str(f), "--json"])
    assert r.exit_code == 0, r.output
    import json

    out = json.loads(r.output)
    assert out["staleness"] == 1 and {c["staleness"] for c in out["candidates"]} == {0, 1, 2}
    r = runner.invoke(app, ["plan", str(f)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "staleness" in r.output and "maxStaleness 2" in r.output and "K staleness" in r.output


# The quickstart's phases on both cores of a 2-core machine, at 32x8 (the committed staleness sweep's
# calibration): one step of the synchronous loop is their sum.
SWEEP_CAL = Calibration(prompts=32, samples_per_prompt=8, generate_s=0.268, reward_s=0.0027, train_s=0.376,
                        sync_s=0.067)


def quickstart_ahead():
    spec = load_rlrun(EXAMPLES / "quickstart.yaml").spec.model_copy(deep=True)
    spec.algorithm.max_staleness, spec.batch.prompts = 1, 32
    return spec


def test_on_a_shared_host_each_side_is_predicted_on_its_share_of_the_cores():
    spec = quickstart_ahead()
    sync = make_plan(spec, SWEEP_CAL, staleness=0, host_cores=2).predicted
    ahead = make_plan(spec, SWEEP_CAL, staleness=1, host_cores=2).predicted
    assert sync.cores is None and sync.generate == pytest.approx(0.268)  # the synchronous loop: every core
    assert ahead.cores == (1, 1)
    # one core of two: f + (1 - f) x 2 with f = 0.5, as the sweep's phases on one core measured
    # (generate x1.37, train x1.53: docs/examples/quickstart-staleness-sweep/sweep.md)
    assert ahead.generate == pytest.approx(0.268 * 1.5) and ahead.train == pytest.approx(0.376 * 1.5)
    assert ahead.step_seconds == pytest.approx(max(ahead.generate + ahead.reward, ahead.train) + ahead.sync)
    gain = ahead.samples_per_second / sync.samples_per_second
    # measured x1.15 (the sweep) to x1.21 (bench/staleness.py); phases on every core would say x1.6
    assert 1.05 < gain < 1.3
    own = make_plan(spec, SWEEP_CAL, staleness=1).predicted  # pods: each side's cores are its own
    assert own.cores is None and own.samples_per_second / sync.samples_per_second > 1.5
    again = Plan.from_dict(make_plan(spec, SWEEP_CAL, staleness=1, host_cores=2).to_dict())
    assert again.predicted.cores == (1, 1)
    assert "split 1 rollout : 1 learner" in make_plan(spec, SWEEP_CAL, host_cores=2).reason


def test_phases_measured_on_a_share_calibrate_the_model_on_every_core():
    spec = quickstart_ahead()
    on_share = Calibration(prompts=32, samples_per_prompt=8, generate_s=0.402, reward_s=0.00405, train_s=0.564,
                           sync_s=0.067, cores=(1, 1))
    sync = make_plan(spec, on_share, staleness=0, host_cores=2).predicted
    assert sync.generate == pytest.approx(0.268) and sync.train == pytest.approx(0.376)
    ahead = make_plan(spec, on_share, staleness=1, host_cores=2).predicted
    assert ahead.generate == pytest.approx(0.402) and ahead.train == pytest.approx(0.564)
    assert Calibration.from_dict(on_share.to_dict()) == on_share
    assert calibration_from({"cores": {"rollout": 1, "learner": 1}}, "cal.yaml").cores == (1, 1)
    with pytest.raises(Exception, match="calibration.cores"):
        calibration_from({"cores": {"rollout": 0, "learner": 2}}, "cal.yaml")


def test_a_run_on_split_cores_records_them_and_its_calibration_keeps_them():
    from rlscale.records import StepRecord

    recs = [StepRecord(step=i, prompts=32, samples_per_prompt=8, phases={"generate": 0.4, "train": 0.56},
                       cores={"rollout": 1, "learner": 1}) for i in range(1, 6)]
    assert Calibration.from_steps(recs).cores == (1, 1)
    assert StepRecord.from_dict(recs[0].to_dict()).cores == {"rollout": 1, "learner": 1}
    assert Calibration.from_steps([StepRecord(step=1, prompts=32, samples_per_prompt=8)]).cores is None
