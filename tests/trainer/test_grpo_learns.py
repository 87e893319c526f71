"""GRPO on the builtin task raises held-out accuracy (DeepSpeed learner, HF generate as the sampler)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

STEPS = 120
SEED = 0
# Calibration runs on a 2-core CPU: +0.116 (seed 0) and +0.148 (seed 1) after 120 steps.
MARGIN = 0.05


def test_grpo_raises_heldout_accuracy(tmp_path, run_ranks):
    from rlscale.trainer.builtin import ensure_builtin_model

    model = ensure_builtin_model("builtin:tiny-arith", progress=False)
    # The calibrated recipe: 16 prompts x 8 samples, Adam lr 1e-4, betas (0.9, 0.99), clip 1.0, no KL.
    config = {"model_path": str(model), "zero_stage": 0, "micro_batch": 64, "lr": 1e-4, "betas": [0.9, 0.99],
              "grad_clip": 1.0}
    results = run_ranks("grpo", {"config": config, "steps": STEPS, "prompts": 16, "samples_per_prompt": 8,
                                 "seed": SEED}, tmp_path, timeout=900)
    line = next(x for x in results[0].stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.split(" ", 1)[1])
    # Greedy evals of the same 500 prompts; models of one recipe spread by about +-0.05, so
    # the margin is well under what 120 steps added in calibration and well over zero.
    assert result["after"] >= result["before"] + MARGIN, result
    early, late = result["rewards"][:10], result["rewards"][-10:]
    assert sum(late) / len(late) > sum(early) / len(early), result

