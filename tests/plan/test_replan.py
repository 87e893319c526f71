"""The driver's re-plan choice: measured throughput wins over the one-point calibrated model."""

import pytest

from rlscale.trainer.replan import ReplanGate, choose_config


def cand(prompts: int, e: float, t: float, rollout: int = 1) -> dict:
    return {"prompts": prompts, "rolloutReplicas": rollout,
            "predicted": {"samplesToTarget": e, "timeToTargetSeconds": t}}


def test_unmeasured_configurations_are_judged_by_the_model():
    best, best_t, cur_t = choose_config([cand(8, 100_000, 400), cand(16, 110_000, 500)], {}, (16, 1))
    assert best["prompts"] == 8 and (best_t, cur_t) == (400, 500)


def test_a_tried_configuration_is_judged_by_what_it_measured():
    # The model says 8 prompts is faster, but 8 prompts ran at 200 samples/s: 100k / 200 = 500 s,
    # while 16 prompts measured 275 samples/s: 110k / 275 = 400 s.
    cands = [cand(8, 100_000, 400), cand(16, 110_000, 500)]
    best, best_t, cur_t = choose_config(cands, {(8, 1): 200.0, (16, 1): 275.0}, (16, 1))
    assert best["prompts"] == 16 and best_t == cur_t == 400


def test_unknown_current_configuration_never_blocks_a_choice():
    best, _, cur_t = choose_config([cand(8, 1, 2)], {}, (64, 1))
    assert best["prompts"] == 8 and cur_t == float("inf")


def test_a_change_waits_for_a_second_re_plan_that_agrees():
    gate = ReplanGate(confirm=2)
    assert not gate.propose((8, 1))  # first sighting: wait
    assert gate.propose((8, 1))  # the next re-plan agrees: apply
    assert not gate.propose((8, 1))  # applied; a new streak starts


def test_flapping_proposals_never_pass_the_gate():
    # What a noisy noise-scale estimate did before the gate: 8, 32, 8, 32, ... prompts.
    gate = ReplanGate(confirm=2)
    assert not any(gate.propose((8 if i % 2 else 32, 1)) for i in range(20))
    # A re-plan that keeps the current configuration breaks a streak.
    gate = ReplanGate(confirm=2)
    assert not gate.propose((8, 1)) and not gate.propose(None) and not gate.propose((8, 1))


def test_a_measured_configuration_also_pays_its_evals():
    # 100k samples at 250 samples/s is 400 s of steps; at 128 samples a step that is 781 steps,
    # each carrying 0.06 s of evals: 447 s. At 256 samples a step the evals cost half as much.
    small = {**cand(16, 100_000, 0), "batch": 128}
    large = {**cand(32, 100_000, 0), "batch": 256}
    for c in (small, large):
        c["predicted"]["evalSecondsPerStep"] = 0.06
    _, t_large, t_small = choose_config([small, large], {(16, 1): 250.0, (32, 1): 250.0}, (16, 1))
    assert t_small == pytest.approx(400 + 100_000 / 128 * 0.06)
    assert t_large == pytest.approx(400 + 100_000 / 256 * 0.06)
