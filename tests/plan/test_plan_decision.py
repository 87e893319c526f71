"""The decision rule: a larger batch wins only when its throughput gain exceeds its samples penalty."""

from __future__ import annotations

import pytest

from rlscale.plan import Calibration, make_plan
from rlscale.plan.decision import (
    Candidate,
    Prediction,
    explain,
    pick,
    prompt_candidates,
    replica_splits,
)
from rlscale.plan.throughput import Phases
from rlscale.spec import parse_spec

SPEC = parse_spec({"model": {"path": "builtin:tiny-arith"}, "optimizer": {"referenceBatch": 64}, "batch": {
    "samplesPerPrompt": 8}, "budget": {"gpus": 8}})


def cand(prompts: int, x: float, e: float, gpus: int = 2) -> Candidate:
    n = prompts * 8
    step = n / x
    pred = Prediction(x, step, e / x, e, Phases(step * 0.6, 0.0, step * 0.4, 0.0))
    return Candidate(prompts, 8, 1, 1, 1e-5, gpus, pred, e / 1e5, 1.0, n, "memory")


def test_larger_batch_wins_when_throughput_gain_exceeds_penalty():
    ref, big = cand(8, 100, 1.0e5), cand(32, 260, 1.3e5)
    win = pick([ref, big])
    assert win is big
    reason = explain(SPEC, win, [big, ref])
    assert reason.startswith("N=256 beats N=64: throughput x2.60 > samples penalty x1.30")


def test_reference_kept_when_penalty_exceeds_gain():
    ref, big = cand(8, 100, 1.0e5), cand(32, 120, 1.5e5)
    win = pick([ref, big])
    assert win is ref
    reason = explain(SPEC, win, [ref, big])
    assert reason.startswith("N=64 kept over N=256: throughput gain x1.20 < samples penalty x1.50")


def test_smaller_batch_wins_when_the_larger_ones_gain_is_too_small():
    ref, small = cand(8, 100, 1.0e5), cand(4, 95, 0.8e5)
    win = pick([ref, small])
    assert win is small
    assert explain(SPEC, win, [small, ref]).startswith(
        "N=32 beats N=64: throughput gain x1.05 < samples penalty x1.25")


def test_near_ties_go_to_fewer_gpus():
    many, few = cand(8, 100.2, 1.0e5, gpus=8), cand(8, 100.0, 1.0e5, gpus=2)
    assert pick([many, few]) is few
    clear = cand(8, 130.0, 1.0e5, gpus=8)
    assert pick([clear, few]) is clear


def test_ratios_print_apart_when_they_are_close():
    ref, big = cand(8, 100, 1.0e5), cand(16, 119.7, 1.2e5)
    reason = explain(SPEC, pick([ref, big]), [ref, big])
    assert "throughput gain x1.197 < samples penalty x1.200" in reason


GEN_BOUND = {"model": {"path": "Qwen/Qwen2.5-1.5B", "maxLength": 4096},
             "task": {"maxNewTokens": 2048, "expectedPromptTokens": 128, "expectedResponseTokens": 1024},
             "batch": {"samplesPerPrompt": 8, "minPrompts": 4, "maxPrompts": 256},
             "optimizer": {"referenceBatch": 64, "lr": 1e-6}, "budget": {"gpus": 8},
             "hardware": {"accelerator": "H100"}, "learner": {"gpusPerReplica": 1}}


def _spec(scaling: str = "sqrt", **over):
    d = {**GEN_BOUND, "optimizer": {**GEN_BOUND["optimizer"], "scaling": scaling}, **over}
    return parse_spec(d)


def test_memory_bound_generation_makes_a_larger_batch_win():
    p = make_plan(_spec())
    assert p.batch > 64
    ref = next(c for c in p.candidates if c.batch == 64)
    win = p.candidates[0]
    # throughput as the run's clock counts it: the step plus its share of the evals
    eff = lambda c: c.batch / (c.predicted.step_seconds + c.predicted.eval_seconds_per_step)  # noqa: E731
    gain = eff(win) / eff(ref)
    penalty = win.predicted.samples_to_target / ref.predicted.samples_to_target
    assert gain > penalty > 1
    # the reason compares within the winner's placement, the row above may be the other's best at N=64
    said = float(p.reason.split("throughput x")[1].split(" ")[0])
    assert p.reason.startswith(f"N={p.batch} beats N=64: throughput x") and said == pytest.approx(gain, rel=0.02)
    assert f"samples penalty x{penalty:.2f}" in p.reason
    assert p.learning_rate == pytest.approx(1e-6 * (p.batch / 64) ** 0.5)


def test_without_retune_the_plan_takes_a_smaller_batch_and_says_why():
    sqrt, none = make_plan(_spec("sqrt")), make_plan(_spec("none"))
    assert none.batch < sqrt.batch
    assert none.learning_rate == 1e-6
    assert "from no lr retune, scaling: none" in none.reason
    # the sqrt plan's batch, run without retune, is slower than the none plan's choice
    at_sqrt_batch = next(c for c in none.candidates if c.batch == sqrt.batch)
    assert at_sqrt_batch.predicted.samples_per_second > none.predicted.samples_per_second
    assert at_sqrt_batch.predicted.time_to_target_seconds > none.predicted.time_to_target_seconds


def test_huge_noise_scale_means_the_fastest_batch_wins():
    p = make_plan(_spec(), Calibration(noise_scale=1e12))
    assert p.noise_scale == 1e12
    assert p.batch == max(c.batch for c in p.candidates)


def test_tiny_noise_scale_means_the_smallest_batch_wins():
    p = make_plan(_spec(), Calibration(noise_scale=1.0))
    assert p.prompts == 4


def test_candidates_are_sorted_and_the_winner_is_first():
    p = make_plan(_spec())
    times = [c.predicted.time_to_target_seconds for c in p.candidates]
    assert times == sorted(times)
    first = p.candidates[0]
    assert (first.prompts, first.rollout_replicas, first.learner_replicas) == \
        (p.prompts, p.rollout_replicas, p.learner_replicas)
    assert {c.prompts for c in p.candidates} == set(prompt_candidates(_spec()))


def test_fixed_prompts_and_replicas_are_kept():
    s = parse_spec({**GEN_BOUND, "batch": {**GEN_BOUND["batch"], "prompts": 12},
                    "rollout": {"replicas": 3}, "learner": {"replicas": 2, "gpusPerReplica": 1}})
    p = make_plan(s)
    assert (p.prompts, p.rollout_replicas, p.learner_replicas) == (12, 3, 2)
    assert p.reason.startswith("N=96 fixed by spec.batch.prompts")


def test_prompt_candidates_powers_of_two_bounds_and_reference():
    s = parse_spec({"model": {"path": "builtin:tiny-arith"}, "batch": {"minPrompts": 3, "maxPrompts": 100,
                                                                       "samplesPerPrompt": 4},
                    "optimizer": {"referenceBatch": 48}})
    assert prompt_candidates(s) == [3, 4, 8, 12, 16, 32, 64, 100]


def test_replica_splits_respect_the_gpu_budget():
    s = parse_spec({"model": {"path": "builtin:tiny-arith"}, "budget": {"gpus": 6}, "rollout": {"maxReplicas": 8,
        "gpusPerReplica": 2},
                    "learner": {"maxReplicas": 8, "gpusPerReplica": 1}})
    splits = replica_splits(s)
    assert (2, 2) in splits and (1, 4) in splits and (3, 1) not in splits
    assert all(2 * r + k <= 6 for r, k in splits)


def test_generation_bound_workload_uses_more_rollout_than_a_train_bound_one():
    gen = make_plan(_spec())
    train_heavy = make_plan(parse_spec({**GEN_BOUND, "task": {"maxNewTokens": 16, "expectedPromptTokens": 2000,
                                                               "expectedResponseTokens": 8}}))
    assert train_heavy.rollout_replicas <= gen.rollout_replicas
    assert train_heavy.learner_replicas >= gen.learner_replicas


def test_cpu_quickstart_plans_one_rollout_and_one_learner(root):
    from rlscale.spec import load_rlrun

    spec = load_rlrun(root / "examples" / "quickstart.yaml").spec
    auto = parse_spec({**spec.model_dump(by_alias=True), "rollout": {"replicas": "auto", "maxReplicas": 4,
                                                                     "gpusPerReplica": 0},
                       "learner": {"replicas": "auto", "maxReplicas": 4, "gpusPerReplica": 0, "zeroStage": 0}})
    p = make_plan(auto)
    assert (p.rollout_replicas, p.learner_replicas) == (1, 1)
    assert p.gpus == 0
    assert 8 <= p.prompts <= 32
    assert any("share one machine" in n for n in p.notes)


def test_model_too_big_for_one_gpu_per_replica_is_a_plan_error():
    from rlscale.plan import PlanError

    s = parse_spec({"model": {"path": "Qwen/Qwen2.5-72B"}, "hardware": {"accelerator": "L4"}, "budget": {"gpus": 2},
                    "learner": {"zeroStage": 3}})
    with pytest.raises(PlanError, match=r"^spec\.(rollout|learner)\."):
        make_plan(s)
