"""The learner's step diagnostics against values computed here in plain PyTorch (float64)."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from rlscale.trainer import algorithms as A

pytestmark = pytest.mark.slow

SPP = 3
REWARDS = [1, 0, 0, 1, 1, 1, 0, 1, 1, 0, 0.5, 1]  # group 1 scores uniformly: 3 of 4 groups mixed
# The sampler's log-probs are the learner's own plus DELTA[t % 3] at response token t: two
# tokens in three stay within the clip range (ratio e^-0.01, e^+0.1), one falls outside (e^0.5).
DELTA = (0.01, -0.1, -0.5)


def make_batch(seed: int) -> dict:
    rng = random.Random(seed)
    prompt_ids, response_ids = [], []
    for _ in range(len(REWARDS) // SPP):
        p = [1] + [rng.randrange(4, 17) for _ in range(rng.randrange(3, 7))]
        for _ in range(SPP):
            prompt_ids.append(p)
            response_ids.append([rng.randrange(4, 17) for _ in range(rng.randrange(1, 5))] + [2])
    return {"prompt_ids": prompt_ids, "response_ids": response_ids, "rewards": REWARDS, "samples_per_prompt": SPP}


def expected(model_path, batch: dict, clip: float = 1.0) -> dict:
    """Per-token log-probs and entropy of the kept samples, the pre-clip gradient norm, and the
    diagnostics the learner must report, all in float64."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float64)
    rewards = torch.tensor(batch["rewards"], dtype=torch.float64)
    adv = A.grpo_advantages(rewards, SPP)
    keep = A.groups_with_signal(rewards, SPP)
    kept = [i for i in range(len(rewards)) if keep[i]]
    total = sum(len(batch["response_ids"][i]) for i in kept)
    loss, entropy, logprobs = 0.0, 0.0, {}
    for i in kept:
        p, r = batch["prompt_ids"][i], batch["response_ids"][i]
        logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : len(p) + len(r) - 1]
        logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r).unsqueeze(-1)).squeeze(-1)
        logprobs[i] = logp.detach()
        loss = loss + (-adv[i] * torch.exp(logp - logp.detach())).sum() / total
        entropy += A.entropy_from_logits(logits.detach()).sum().item()
    loss.backward()
    norm = math.sqrt(sum((p.grad**2).sum().item() for p in model.parameters() if p.grad is not None))
    deltas = [DELTA[t % 3] for i in kept for t in range(len(batch["response_ids"][i]))]
    return {"logprobs": logprobs, "grad_norm": norm, "entropy": entropy / total,
            "logprob_diff": sum(deltas) / total, "logprob_abs_diff": sum(abs(d) for d in deltas) / total,
            "clip_fraction": sum(abs(d) > 0.2 for d in deltas) / total, "mixed_group_fraction": 0.75}


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_step_reports_diagnostics_and_the_gradient_norm_before_clipping(small_model, tmp_path, run_ranks, zero_stage):
    batch = make_batch(5)
    want = expected(small_model, batch)
    # Rollout log-probs for every sample (the learner reads only the kept ones).
    batch["rollout_logprobs"] = [
        [(want["logprobs"][i][t].item() if i in want["logprobs"] else 0.0) + DELTA[t % 3] for t in range(len(r))]
        for i, r in enumerate(batch["response_ids"])]
    config = {"model_path": str(small_model), "zero_stage": zero_stage, "micro_batch": 6, "lr": 1e-3,
              "grad_clip": 1e-3}  # a clip far below the norm: the reported norm must be the one before it
    results = run_ranks("fixed", {"config": config, "batches": [batch], "lrs": [1e-3], "out": str(tmp_path)},
                        tmp_path, world_size=1)
    (stats,) = [json.loads(x.split(" ", 1)[1]) for x in results[0].stdout.splitlines() if x.startswith("STATS ")]
    assert want["grad_norm"] > 100 * config["grad_clip"]
    # float32 learner vs float64 reference over a few hundred tokens: agreement to ~1e-6 relative;
    # 1e-4 is far below any wrong scaling (world size, token count, a clipped norm).
    for key in ("grad_norm", "entropy", "logprob_diff", "logprob_abs_diff"):
        assert stats[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    assert stats["clip_fraction"] == pytest.approx(want["clip_fraction"])
    assert stats["mixed_group_fraction"] == pytest.approx(want["mixed_group_fraction"])
    assert stats["samples_trained"] == 9.0


def test_a_batch_without_rollout_logprobs_reports_no_mismatch(small_model, tmp_path, run_ranks):
    config = {"model_path": str(small_model), "zero_stage": 0, "micro_batch": 6, "lr": 1e-3}
    results = run_ranks("fixed", {"config": config, "batches": [make_batch(6)], "lrs": [1e-3], "out": str(tmp_path)},
                        tmp_path, world_size=1)
    (stats,) = [json.loads(x.split(" ", 1)[1]) for x in results[0].stdout.splitlines() if x.startswith("STATS ")]
    assert "logprob_diff" not in stats and "logprob_abs_diff" not in stats  # unknown, not 0
    assert stats["clip_fraction"] == 0.0  # against the learner's own log-probs the ratio is 1
    assert stats["entropy"] > 0 and stats["grad_norm"] > 0
