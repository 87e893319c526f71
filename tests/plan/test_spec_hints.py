"""Spec hints the planner takes: a known noise scale and known samples-to-target."""

from rlscale.plan import make_plan
from rlscale.spec import parse_spec

BASE = {"hardware": {"accelerator": "H100"}, "budget": {"gpus": 16},
        "model": {"path": "Qwen/Qwen2.5-7B", "maxLength": 2048},
        "task": {"maxNewTokens": 1024, "expectedPromptTokens": 256, "expectedResponseTokens": 512}}


def test_expected_samples_sets_the_absolute_time_but_not_the_ratios():
    a = make_plan(parse_spec(BASE))
    b = make_plan(parse_spec({**BASE, "target": {"expectedSamples": 2 * a.predicted.samples_to_target * 1.0}}))
    assert (a.prompts, a.rollout_replicas) == (b.prompts, b.rollout_replicas)
    assert b.predicted.time_to_target_seconds > a.predicted.time_to_target_seconds


def test_spec_noise_scale_is_used():
    small = make_plan(parse_spec({**BASE, "optimizer": {"noiseScale": 16}}))
    large = make_plan(parse_spec({**BASE, "optimizer": {"noiseScale": 100000}}))
    assert small.noise_scale == 16 and large.noise_scale == 100000
    assert small.prompts <= large.prompts  # a small noise scale makes large batches wasteful
