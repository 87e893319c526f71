"""Learner memory features on real DeepSpeed ranks (CPU, gloo): micro-batches of any size (a prompt group
may span them), token budgets, gradient checkpointing and chunked log-probs leave the loss and gradient
unchanged; ZeRO 2/3 measure the noise scale; the weights stream a bucket at a time."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import _run_ranks

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("memory_worker.py")


def run(mode: str, args: dict, workdir: Path, world_size: int = 1, timeout: float = 300) -> list[str]:
    """The memory worker's ranks on loopback; each rank's output (a failing rank fails the test)."""
    return [r.stdout for r in _run_ranks(mode, args, workdir, world_size, timeout, worker=WORKER)]


def make_batch(seed: int, prompts: int, spp: int) -> dict:
    """Prompts and responses of different lengths; every group's rewards are mixed."""
    rng = random.Random(seed)
    prompt_ids, response_ids, rewards = [], [], []
    for _ in range(prompts):
        p = [1] + [rng.randrange(4, 17) for _ in range(rng.randrange(2, 9))]
        for j in range(spp):
            prompt_ids.append(p)
            response_ids.append([rng.randrange(4, 17) for _ in range(rng.randrange(0, 12))] + [2])
            rewards.append(float(j % 2) if j < 2 else rng.random())
    return {"prompt_ids": prompt_ids, "response_ids": response_ids, "rewards": rewards, "samples_per_prompt": spp}


def test_loss_and_gradient_do_not_depend_on_the_micro_batches(small_model, tmp_path):
    """Groups of 4 split over micro-batches of 1 and 3 sequences, or a 24-token budget, with gradient
    checkpointing and log-probs in chunks of 5 positions: the same loss and gradient as one micro-batch of
    32 with the full logits, within float32 rounding. An entropy bonus and the sequence-mean aggregation
    make every part of the loss count. PPO likewise, its critic's value loss included."""
    base = {"model_path": str(small_model), "zero_stage": 0, "lr": 1e-3, "grad_clip": 0.0, "entropy_coef": 0.01,
            "loss_aggregation": "seq-mean-token-mean", "measure_noise": True}
    configs = {
        "mb32": {**base, "micro_batch": 32, "logprob_chunk": 0},
        "mb1": {**base, "micro_batch": 1, "logprob_chunk": 5},
        "mb3-ckpt": {**base, "micro_batch": 3, "logprob_chunk": 5, "gradient_checkpointing": True},
        "tokens24": {**base, "micro_batch": 32, "micro_batch_tokens": 24, "logprob_chunk": 1024},
        # PPO: a critic (checkpointed too) and GAE whitened over the rank's share, across micro-batches.
        "ppo": {**base, "algorithm": "ppo", "micro_batch": 32, "logprob_chunk": 0},
        "ppo-mb1-ckpt": {**base, "algorithm": "ppo", "micro_batch": 1, "logprob_chunk": 5,
                         "gradient_checkpointing": True},
    }
    run("grads", {"configs": configs, "batch": make_batch(0, 5, 4), "out": str(tmp_path)}, tmp_path)
    got = torch.load(tmp_path / "grads.pt")
    for base_tag in ("mb32", "ppo"):
        assert got[base_tag]["grads"] and math.isfinite(got[base_tag]["stats"]["loss"])
        # a gradient worth comparing
        assert max(g.abs().max().item() for g in got[base_tag]["grads"].values()) > 1e-4
    for tag, base_tag in (("mb1", "mb32"), ("mb3-ckpt", "mb32"), ("tokens24", "mb32"), ("ppo-mb1-ckpt", "ppo")):
        ref, s = got[base_tag], got[tag]["stats"]
        assert s["value_loss"] == pytest.approx(ref["stats"]["value_loss"], rel=1e-4, abs=1e-7), tag
        assert s["loss"] == pytest.approx(ref["stats"]["loss"], rel=1e-4, abs=1e-6), tag
        assert s["entropy"] == pytest.approx(ref["stats"]["entropy"], rel=1e-4), tag
        assert s["grad_norm"] == pytest.approx(ref["stats"]["grad_norm"], rel=1e-4), tag
        assert sorted(got[tag]["grads"]) == sorted(ref["grads"])
        for name, g in ref["grads"].items():
            assert torch.allclose(got[tag]["grads"][name], g, rtol=1e-4, atol=1e-6), (tag, name)
        # Each measured the noise at a group-aligned boundary, however small its micro-batches.
        assert s["noise_grad_sq"] is not None and math.isfinite(s["noise_trace"]), tag


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_zero_2_and_3_measure_the_noise_scale_and_stream_the_weights(small_model, tmp_path, zero_stage):
    """Two ranks: the noise scale's raw estimates are in every step's stats; the big-batch norm is the
    whole batch's gradient norm DeepSpeed reports (the partitions add up to it). With a KL reference
    (sharded at ZeRO-3). Then the weights stream one parameter at a time, the same as export_weights,
    and an iteration closed early leaves the followers in step."""
    config = {"model_path": str(small_model), "zero_stage": zero_stage, "micro_batch": 3, "lr": 1e-3,
              "kl_coef": 0.05, "logprob_chunk": 4, "gradient_checkpointing": zero_stage == 3}
    batches = [make_batch(s, 6, 4) for s in (1, 2)]
    outs = run("zero", {"config": config, "batches": batches, "bucket_bytes": 1}, tmp_path, world_size=2)
    stats = [json.loads(x.split(" ", 1)[1]) for x in outs[0].splitlines() if x.startswith("STATS ")]
    assert len(stats) == 2
    for s in stats:
        assert s["skipped"] == 0.0 and s["samples_trained"] == 24.0
        assert math.isfinite(s["noise_grad_sq"]) and math.isfinite(s["noise_trace"]), s
        assert s["noise_trace"] != 0.0
        small_sq, big_sq = s["noise_norms"]
        assert big_sq == pytest.approx(s["grad_norm"] ** 2, rel=1e-3)
        assert 0 < small_sq and small_sq != pytest.approx(big_sq, rel=1e-6)
    assert stats[-1]["noise_scale"] is None or math.isfinite(stats[-1]["noise_scale"])
    assert any(s["kl"] > 0 for s in stats[1:])  # the reference is used, and the policy moved from it
    weights = [json.loads(x.split(" ", 1)[1]) for x in outs[0].splitlines() if x.startswith("WEIGHTS ")][0]
    assert weights["names"] and weights["same"] and weights["dtype"] == "torch.float64"
    assert weights["shapes"]["model.embed_tokens.weight"] == [17, 128]
    assert "FOLLOWED ended" in outs[1]
