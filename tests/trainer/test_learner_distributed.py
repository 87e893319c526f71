"""Two DeepSpeed ranks on CPU (gloo) against a one-process plain-PyTorch reference."""

from __future__ import annotations

import json
import random

import pytest
import torch

from rlscale.trainer import algorithms as A

pytestmark = pytest.mark.slow

LRS = [1e-3, 5e-4]  # the second step changes the learning rate, as a re-plan would


def make_batch(seed: int, prompts: int, spp: int, rewards: list[float]) -> dict:
    rng = random.Random(seed)
    prompt_ids, response_ids = [], []
    for _ in range(prompts):
        p = [1] + [rng.randrange(4, 17) for _ in range(rng.randrange(3, 7))]
        for _ in range(spp):
            prompt_ids.append(p)
            response_ids.append([rng.randrange(4, 17) for _ in range(rng.randrange(0, 4))] + [2])
    return {"prompt_ids": prompt_ids, "response_ids": response_ids, "rewards": rewards, "group_size": spp}


BATCHES = [
    # Group 2 scores uniformly and is left out; 9 samples remain, uneven across 2 ranks.
    make_batch(1, 4, 3, [1, 0, 0, 1, 1, 1, 0, 1, 1, 0, 0.5, 1]),
    make_batch(2, 3, 3, [0, 1, 0, 1, 0, 0, 0.2, 0.9, 0.4]),
]


def reference_step(model, opt, batch: dict, lr: float) -> None:
    """GRPO step in plain PyTorch: whole batch at once, token-level mean, clip 1.0, AdamW."""
    spp = batch["group_size"]
    rewards = torch.tensor(batch["rewards"], dtype=torch.float32)
    adv = A.grpo_advantages(rewards, spp)
    keep = A.groups_with_signal(rewards, spp)
    kept = [i for i in range(len(rewards)) if keep[i]]
    total = sum(len(batch["response_ids"][i]) for i in kept)
    loss = 0.0
    for i in kept:
        p, r = batch["prompt_ids"][i], batch["response_ids"][i]
        logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : len(p) + len(r) - 1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(r).unsqueeze(-1)).squeeze(-1)
        # On-policy ratio exp(logp - logp.detach()) = 1 with gradient grad(logp).
        loss = loss + (-adv[i] * torch.exp(logp - logp.detach())).sum() / total
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    for g in opt.param_groups:
        g["lr"] = lr
    opt.step()


@pytest.mark.parametrize("zero_stage", [1, 2, 3])
def test_two_ranks_match_one_process_reference(small_model, tmp_path, zero_stage, run_ranks):
    from transformers import AutoModelForCausalLM

    config = {"model_path": str(small_model), "zero_stage": zero_stage, "micro_batch": 2, "lr": LRS[0],
              "betas": [0.9, 0.99], "grad_clip": 1.0, "measure_noise": zero_stage < 2}
    results = run_ranks("fixed", {"config": config, "batches": BATCHES, "lrs": LRS, "out": str(tmp_path)},
                        tmp_path, world_size=2)
    stats = [json.loads(line.split(" ", 1)[1]) for line in results[0].stdout.splitlines() if line.startswith("STATS ")]
    assert [s["samples_trained"] for s in stats] == [9.0, 9.0]
    assert stats[1]["lr"] == pytest.approx(LRS[1])

    exported = torch.load(tmp_path / "exported.pt")
    rank0 = torch.load(tmp_path / "rank0.pt") if zero_stage < 3 else exported
    rank1 = torch.load(tmp_path / "rank1.pt") if zero_stage < 3 else exported
    model = AutoModelForCausalLM.from_pretrained(small_model)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=LRS[0], betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    for batch, lr in zip(BATCHES, LRS, strict=True):
        reference_step(model, opt, batch, lr)

    moved = max((rank0[n] - initial[n]).abs().max().item() for n in initial)
    assert moved > 1e-4, "the steps did not change the parameters"
    # The weights published to rollout: every parameter under its HF name, as trained.
    assert sorted(exported) == sorted(n for n, _ in model.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(exported[name], rank0[name], atol=0, rtol=0)
        torch.testing.assert_close(rank0[name], rank1[name], atol=1e-6, rtol=0, msg=f"ranks differ in {name}")
        # Adam divides by sqrt(v): elements whose gradient is ~0 amplify summation-order noise,
        # so the tolerance is a small fraction of the update size, not float32 epsilon.
        torch.testing.assert_close(rank0[name], p.detach(), atol=2e-5, rtol=0, msg=f"reference differs in {name}")


def test_ppo_critic_learns_and_kl_to_reference_grows(small_model, tmp_path, run_ranks):
    """PPO with a critic and a KL-penalised reward: the value loss falls on a repeated batch,
    and the policy drifts measurably from the frozen reference."""
    config = {"model_path": str(small_model), "algorithm": "ppo", "kl_coef": 0.05, "micro_batch": 8, "lr": 3e-3,
              "gamma": 1.0, "lam": 0.95, "value_coef": 0.5}
    batch = make_batch(3, 4, 3, [1, 0, 0, 1, 1, 1, 0, 1, 1, 0, 0.5, 1])
    results = run_ranks("fixed", {"config": config, "batches": [batch] * 6, "lrs": [3e-3] * 6,
                                  "out": str(tmp_path)}, tmp_path, world_size=1)
    stats = [json.loads(line.split(" ", 1)[1]) for line in results[0].stdout.splitlines() if line.startswith("STATS ")]
    assert len(stats) == 6
    assert stats[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the policy starts as the reference
    assert stats[-1]["kl"] > 1e-4
    assert min(s["value_loss"] for s in stats[-3:]) < 0.5 * stats[0]["value_loss"]
    assert all(s["samples_trained"] == 12.0 for s in stats)  # PPO keeps every sample
