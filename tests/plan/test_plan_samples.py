"""Learning-rate rules and the samples-to-target model."""

from __future__ import annotations

import math

import pytest

from rlscale.plan.samples import (
    lr_mismatch,
    mismatch_penalty,
    noise_curve,
    reference_samples,
    run_key,
    samples_to_target,
    scaled_lr,
)


def test_lr_rules():
    assert scaled_lr(1e-4, 512, 128, "sqrt") == pytest.approx(2e-4)
    assert scaled_lr(1e-4, 32, 128, "sqrt") == pytest.approx(5e-5)
    assert scaled_lr(1e-4, 512, 128, "linear") == pytest.approx(4e-4)
    assert scaled_lr(1e-4, 512, 128, "none") == 1e-4


def test_noise_curve_passes_through_the_reference():
    assert noise_curve(64, 64, 256) == 1.0
    # (1 + 256/256) / (1 + 64/256) = 2 / 1.25
    assert noise_curve(256, 64, 256) == pytest.approx(1.6)
    assert noise_curve(16, 64, 256) == pytest.approx((1 + 16 / 256) / 1.25)
    # far below the noise scale, more samples per step cost (almost) nothing
    assert noise_curve(1024, 64, 1e9) == pytest.approx(1.0, abs=1e-5)


def test_sqrt_rule_is_the_invariant_one():
    assert lr_mismatch(1024, 64, "sqrt") == 1.0
    assert mismatch_penalty(1.0) == 1.0
    assert samples_to_target(256, 1e5, 64, 256, "sqrt") == pytest.approx(1.6e5)


def test_without_retune_large_batches_pay_more():
    # 4x the batch at a fixed lr: m = 1/sqrt(4) = 0.5 -> progress 2m - m^2 = 0.75 -> x1.33 samples
    assert lr_mismatch(256, 64, "none") == pytest.approx(0.5)
    assert mismatch_penalty(0.5) == pytest.approx(4 / 3)
    e_none = samples_to_target(256, 1e5, 64, 256, "none")
    e_sqrt = samples_to_target(256, 1e5, 64, 256, "sqrt")
    assert e_none / e_sqrt == pytest.approx(4 / 3)
    # at the reference batch all rules agree
    assert samples_to_target(64, 1e5, 64, 256, "none") == pytest.approx(1e5)


def test_linear_rule_overshoots_adam():
    m = lr_mismatch(256, 64, "linear")
    assert m == pytest.approx(2.0)
    assert mismatch_penalty(m) == pytest.approx(10.0)  # floored: progress would otherwise reach zero
    assert mismatch_penalty(math.sqrt(2)) == pytest.approx(1 / (2 * math.sqrt(2) - 2))


def test_reference_samples_for_the_builtin_task():
    from rlscale.spec import parse_spec

    key = run_key(parse_spec({"hardware": {"accelerator": "cpu"}}))  # defaults: tiny-arith, level 1, accuracy 0.8
    # measured at 256 samples a step (38,400: samples.KNOWN_SAMPLES_TO_TARGET), moved along the noise curve
    e, known = reference_samples(key, 128, 512)
    assert known and e == pytest.approx(38_400 * (1 + 128 / 512) / (1 + 256 / 512))
    e64, _ = reference_samples(key, 64, 512)
    assert e64 == pytest.approx(38_400 * (1 + 64 / 512) / (1 + 256 / 512))
    other = run_key(parse_spec({"model": {"path": "Qwen/Qwen2.5-7B"}}))
    e_other, known_other = reference_samples(other, 64, 256)
    assert not known_other and e_other > 0
    harder = run_key(parse_spec({"hardware": {"accelerator": "cpu"}, "target": {"value": 0.95}}))
    assert not reference_samples(harder, 128, 512)[1]
