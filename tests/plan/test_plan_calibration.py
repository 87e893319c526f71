"""Calibration: measured phases move the predictions onto the measurements; a measured noise
scale replaces the default."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rlscale.plan import Calibration, make_plan
from rlscale.plan.decision import system_model
from rlscale.records import StepRecord
from rlscale.spec import parse_spec

BASE = {"model": {"path": "Qwen/Qwen2.5-7B", "maxLength": 2048},
        "task": {"maxNewTokens": 1024, "expectedPromptTokens": 256, "expectedResponseTokens": 512},
        "batch": {"samplesPerPrompt": 8, "minPrompts": 4, "maxPrompts": 128},
        "optimizer": {"referenceBatch": 128, "lr": 1e-6}, "budget": {"gpus": 8}, "hardware": {"accelerator": "H100"},
        "rollout": {"replicas": 2}, "learner": {"replicas": 2, "zeroStage": 3, "gpusPerReplica": 1}}
MEASURED = Calibration(prompts=16, samples_per_prompt=8, rollout_replicas=2, learner_replicas=2,
                       generate_s=30.0, reward_s=0.5, train_s=12.0, sync_s=3.0)


def test_calibration_moves_prediction_to_the_measured_phases():
    fixed = parse_spec({**BASE, "batch": {**BASE["batch"], "prompts": 16}})
    before = make_plan(fixed)
    after = make_plan(fixed, MEASURED)
    ph = after.predicted.phases
    assert (ph.generate, ph.reward, ph.train, ph.sync) == pytest.approx((30.0, 0.5, 12.0, 3.0))
    assert after.predicted.step_seconds == pytest.approx(45.5)
    assert after.predicted.samples_per_second == pytest.approx(128 / 45.5)
    assert before.predicted.step_seconds != pytest.approx(45.5, rel=0.2)  # it did move
    assert after.calibrated and not before.calibrated
    assert after.to_dict()["calibrated"] is True
    assert "calibrated from" in after.reason


def test_calibration_scales_every_candidate_by_the_same_phase_factor():
    auto = parse_spec(BASE)
    before = {c.prompts: c.predicted.phases for c in make_plan(auto).candidates}
    after = {c.prompts: c.predicted.phases for c in make_plan(auto, MEASURED).candidates}
    g = after[16].generate / before[16].generate
    t = after[16].train / before[16].train
    assert after[16].generate == pytest.approx(30.0)
    for p in before:
        assert after[p].generate / before[p].generate == pytest.approx(g)
        assert after[p].train / before[p].train == pytest.approx(t)


def test_measured_noise_scale_is_used_and_changes_the_choice():
    auto = parse_spec(BASE)
    default = make_plan(auto)
    assert default.noise_scale == 4 * 128
    small = make_plan(auto, Calibration(noise_scale=8.0))
    large = make_plan(auto, Calibration(noise_scale=1e9))
    assert small.noise_scale == 8.0 and large.noise_scale == 1e9
    assert small.batch < large.batch


def test_measured_response_length_changes_generation():
    spec = parse_spec(BASE)
    short = system_model(spec, Calibration(response_tokens=64))
    long = system_model(spec)
    assert short.response_tokens == 64 and long.response_tokens == 512
    # a quarter of the mean, and the batch's longest response (what a step waits for) shorter too
    assert short.generation(16, 8, 2).seconds < long.generation(16, 8, 2).seconds / 2
    generated = system_model(spec, Calibration(tokens_per_sample=300))  # generated tokens, as the driver counts
    assert generated.response_tokens == 300 and generated.prompt_tokens == 256


def _step(prompts, gen, noise=None, spp=8, **more):
    # A step record as the driver writes it to metrics.jsonl.
    return StepRecord(prompts=prompts, samples_per_prompt=spp, rollout_replicas=1, learner_replicas=1,
                      phases={"generate": gen, "reward": 0.01, "train": 2 * gen, "sync": 0.1}, noise_scale=noise,
                      **more)


def test_from_steps_takes_the_median_of_the_latest_configuration():
    old = [_step(8, 9.0, noise=50.0) for _ in range(20)]
    new = [_step(16, 1.0 + 0.01 * i, noise=100.0) for i in range(15)]
    new[-3] = _step(16, 500.0, noise=100.0)  # a shared machine stalled for one step
    cal = Calibration.from_steps(old + new, last=10)
    assert (cal.prompts, cal.samples_per_prompt, cal.rollout_replicas, cal.learner_replicas) == (16, 8, 1, 1)
    assert cal.steps == 10
    assert 1.05 <= cal.generate_s <= 1.14  # the median ignores the stall and the old configuration
    assert cal.train_s == pytest.approx(2 * cal.generate_s, rel=0.02)
    assert cal.noise_scale == 100.0
    assert cal.calibrated


def test_from_steps_tolerates_missing_values():
    recs = [StepRecord(prompts=4, samples_per_prompt=8, phases={"generate": 0.2, "train": None}),
            StepRecord(prompts=4, samples_per_prompt=8, phases={"generate": 0.4}, noise_scale=float("nan"))]
    cal = Calibration.from_steps(recs)
    assert cal.generate_s == pytest.approx(0.3)
    assert cal.train_s is None and cal.noise_scale is None
    assert cal.has_phases and not cal.has_noise_scale
    assert not Calibration.from_steps([]).calibrated


def test_from_steps_counts_generated_tokens_per_sample():
    recs = [_step(4, 0.2, generated_tokens=320, batch_samples=32),
            _step(4, 0.2, generated_tokens=384, batch_samples=32)]
    assert Calibration.from_steps(recs).tokens_per_sample == pytest.approx(11.0)


def test_plan_from_step_records_end_to_end():
    spec = parse_spec({**BASE, "batch": {**BASE["batch"], "prompts": 16},
                       "rollout": {"replicas": 1}, "learner": {"replicas": 2, "zeroStage": 3, "gpusPerReplica": 1}})
    recs = [replace(_step(16, 20.0, noise=300.0), learner_replicas=2) for _ in range(5)]
    p = make_plan(spec, Calibration.from_steps(recs))
    assert p.predicted.generate == pytest.approx(20.0)
    assert p.predicted.train == pytest.approx(40.0)
    assert p.noise_scale == 300.0


def test_the_measured_configuration_is_among_the_candidates():
    auto = parse_spec({**BASE, "rollout": {"replicas": "auto", "maxReplicas": 4},
                       "learner": {"replicas": "auto", "maxReplicas": 6, "zeroStage": 3, "gpusPerReplica": 1}})
    cal = Calibration(prompts=4, samples_per_prompt=8, rollout_replicas=1, learner_replicas=2,
                      generate_s=30.0, train_s=2.0, reward_s=0.1, sync_s=1.0)
    p = make_plan(auto, cal)
    rows = [c for c in p.candidates if (c.prompts, c.rollout_replicas, c.learner_replicas) == (4, 1, 2)]
    assert len(rows) == 1
    assert rows[0].predicted.step_seconds == pytest.approx(33.1)
    times = [c.predicted.time_to_target_seconds for c in p.candidates]
    assert times == sorted(times)


def test_noise_scale_from_the_spec_unless_measured():
    spec = parse_spec({**BASE, "optimizer": {**BASE.get("optimizer", {}), "noiseScale": 77.0}})
    assert make_plan(spec).noise_scale == 77.0
    assert make_plan(spec, Calibration(noise_scale=5.0)).noise_scale == 5.0  # measured wins


def _noisy(g, t, prompts=16):
    return [_step(prompts, 1.0, noise=1e6, noise_grad_sq=gi, noise_trace=ti) for gi, ti in zip(g, t, strict=True)]


def test_noise_scale_is_the_ratio_of_mean_estimates_when_steps_carry_them():
    # Per-step estimates scatter (the trace even goes negative); their means are what B_simple needs.
    recs = _noisy([1.2, 0.8, 1.1, 0.9, 1.0, 1.0], [900.0, 100.0, -200.0, 400.0, 600.0, 1200.0])  # means 1.0, 500
    assert Calibration.from_steps(recs, last=3, noise_last=6).noise_scale == pytest.approx(500.0)
    # noise_last bounds the window: older steps (here at another configuration) drop out.
    old = _noisy([1.0] * 10, [50.0] * 10, prompts=8)
    assert Calibration.from_steps(old + recs, last=3, noise_last=6).noise_scale == pytest.approx(500.0)
    both = Calibration.from_steps(old + recs, last=3, noise_last=16)
    assert both.noise_scale == pytest.approx((500 + 3000) / (10 + 6))


def test_a_gradient_lost_in_its_noise_gives_no_noise_scale():
    # Mean |G|^2 = 1.0 but within two standard errors of 0 (what RL steps mostly look like):
    # the ratio could be anything, so the plan keeps its prior instead of a wild value.
    recs = _noisy([2.0, -1.0, 3.0, 0.5, 0.5, 1.0], [500.0] * 6)
    assert Calibration.from_steps(recs, noise_last=6).noise_scale is None
    assert Calibration.from_steps(_noisy([-1.0] * 8, [5.0] * 8)).noise_scale is None


def test_noise_scale_falls_back_to_the_median_of_reported_values():
    few = [_step(16, 1.0, noise=300.0, noise_grad_sq=1.0, noise_trace=5.0) for _ in range(3)]
    assert Calibration.from_steps(few).noise_scale == 300.0  # too few pairs: the reported B_simple


def test_a_measured_eval_is_charged_per_step_and_favours_larger_batches(root):
    from rlscale.spec import load_rlrun

    spec = load_rlrun(root / "examples" / "quickstart.yaml").spec  # cpu, 8-32 prompts
    per_step = 6.0 / spec.target.eval_every
    steps = [_step(16, 0.2) for _ in range(20)]
    costly_cal = Calibration.from_steps(steps[:-5] + [_step(16, 0.2, eval_seconds=6.0)] + steps[-4:])
    assert costly_cal.eval_s == 6.0  # one eval in the window, 6 s / evalEvery per step at any batch
    cheap = make_plan(spec, Calibration.from_steps(steps + [_step(16, 0.2, eval_seconds=0.001)]))
    costly = make_plan(spec, costly_cal)
    for c in costly.candidates:
        assert c.predicted.eval_seconds_per_step == pytest.approx(per_step)
        steps_to_target = c.predicted.samples_to_target / c.batch
        expected = steps_to_target * (c.predicted.step_seconds + per_step)
        assert c.predicted.time_to_target_seconds == pytest.approx(expected)
    # The same cost every step weighs less per sample at a larger batch.
    def ratio(plan):
        t = {c.prompts: c.predicted.time_to_target_seconds for c in plan.candidates}
        return t[32] / t[16]
    assert ratio(costly) < ratio(cheap) - 0.05
