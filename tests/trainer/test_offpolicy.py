"""Off-policy correction and several updates per batch (spec.algorithm.isCap, epochs, miniBatches) on
real DeepSpeed ranks (CPU, gloo; tests/trainer/offpolicy_worker.py): the truncated importance weight
against a float64 reference written out here, one epoch and one mini-batch bit for bit the on-policy
step, epochs x miniBatches optimiser steps with a clip that acts, and two ranks against one; with spec.lora, a
batch one weights version stale (algorithm.maxStaleness: 1) weighted against the adapter it was sampled with."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from rlscale.trainer import algorithms as A
from rlscale.trainer.batching import mini_batch_groups
from rlscale.trainer.losses import truncated_is_weight
from tests.trainer.conftest import finish_ranks, start_ranks

WORKER = Path(__file__).with_name("offpolicy_worker.py")
CAP = 2.0
# log pi_old - log pi_behaviour at response token t is DELTA[t % 3]: weights e^-0.3 and e^0.2 pass, e^1 > CAP
# is truncated to CAP.
DELTA = (-0.3, 0.2, 1.0)
SGD_LR = 0.5


def make_batch(seed: int, prompts: int, spp: int, uniform: tuple[int, ...] = ()) -> dict:
    """Prompts and responses of different lengths; the groups in `uniform` score alike, the others are mixed."""
    rng = random.Random(seed)
    prompt_ids, response_ids, rewards = [], [], []
    for g in range(prompts):
        p = [1] + [rng.randrange(4, 17) for _ in range(rng.randrange(2, 8))]
        for j in range(spp):
            prompt_ids.append(p)
            response_ids.append([rng.randrange(4, 17) for _ in range(rng.randrange(0, 7))] + [2])
            rewards.append(1.0 if g in uniform else float(j % 2) if j < 2 else rng.random())
    return {"prompt_ids": prompt_ids, "response_ids": response_ids, "rewards": rewards, "samples_per_prompt": spp}


def reference_logprobs(model, batch: dict) -> list[torch.Tensor]:
    """Each sample's response log-probs under `model`, one sequence at a time."""
    out = []
    for p, r in zip(batch["prompt_ids"], batch["response_ids"], strict=True):
        logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1: len(p) + len(r) - 1]
        out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(r).unsqueeze(-1)).squeeze(-1))
    return out


def is_cap_reference(model_path: Path, batch: dict) -> dict:
    """GRPO with truncated importance sampling at ratio 1, token-mean, written out in float64: the loss
    sum_{i,t} min(e^DELTA_t, CAP) (-A_i) / T token by token, its gradient's norm, the weights' mean and
    the share of truncated tokens over the kept samples' tokens."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float64)
    spp = batch["samples_per_prompt"]
    rewards = torch.tensor(batch["rewards"], dtype=torch.float32)
    adv = A.grpo_advantages(rewards, spp).double()
    keep = A.groups_with_signal(rewards, spp)
    logprobs = reference_logprobs(model, batch)
    kept = [i for i in range(len(rewards)) if keep[i]]
    total = sum(len(batch["response_ids"][i]) for i in kept)
    loss, value, weights, truncated = 0.0, 0.0, 0.0, 0
    for i in kept:
        for t, lp in enumerate(logprobs[i]):
            w = min(math.exp(DELTA[t % 3]), CAP)
            value += w * -adv[i].item() / total
            loss = loss + w * -adv[i] * torch.exp(lp - lp.detach()) / total
            weights += w
            truncated += math.exp(DELTA[t % 3]) >= CAP
    loss.backward()
    norm = math.sqrt(sum((p.grad ** 2).sum().item() for p in model.parameters() if p.grad is not None))
    behaviour = [[lp[t].item() - DELTA[t % 3] for t in range(len(lp))] for lp in logprobs]
    return {"loss": value, "grad_norm": norm, "is_weight_mean": weights / total,
            "is_truncated_fraction": truncated / total, "rollout_logprobs": behaviour}


def base_logprobs(model_path: Path, batches: list[dict]) -> list[list[list[float]]]:
    """Each batch's response log-probs under the base model (float64): what the engines sample with at weights
    version 0 with spec.lora, since a fresh adapter (B = 0) is the base and the first update sends the first."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float64)
    with torch.no_grad():
        return [[lp.tolist() for lp in reference_logprobs(model, b)] for b in batches]


def stale_reference(model_path: Path, merged: dict[str, torch.Tensor], batch: dict, cap: float) -> dict:
    """GRPO with truncated importance sampling, token-mean, in float64, for a batch sampled by an older policy
    (its rollout_logprobs) and trained by the policy `merged` (the LoRA learner's weights, adapter merged in):
    ratio 1 to pi_old = `merged`, each token weighted by min(pi_old / pi_behaviour, cap)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float64)
    missing, unexpected = model.load_state_dict({k: v.double() for k, v in merged.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # lm_head: tied
    spp = batch["samples_per_prompt"]
    rewards = torch.tensor(batch["rewards"], dtype=torch.float32)
    adv, keep = A.grpo_advantages(rewards, spp).double(), A.groups_with_signal(rewards, spp)
    with torch.no_grad():
        old = reference_logprobs(model, batch)
    kept = [i for i in range(len(rewards)) if keep[i]]
    total = sum(len(batch["response_ids"][i]) for i in kept)
    loss = weights = truncated = diff = 0.0
    log_ratios = []
    for i in kept:
        for lp, behaviour in zip(old[i].tolist(), batch["rollout_logprobs"][i], strict=True):
            w = min(math.exp(lp - behaviour), cap)
            loss += w * -adv[i].item() / total
            weights += w
            truncated += math.exp(lp - behaviour) >= cap
            diff += behaviour - lp
            log_ratios.append(abs(lp - behaviour))
    return {"loss": loss, "is_weight_mean": weights / total, "is_truncated_fraction": truncated / total,
            "logprob_diff": diff / total, "max_abs_log_ratio": max(log_ratios)}


def start(mode: str, args: dict, workdir: Path, world_size: int, threads: int) -> list:
    """`world_size` ranks of the worker on loopback (not waited for)."""
    return start_ranks(mode, args, workdir, world_size, WORKER, threads)


def finish(procs: list, timeout: float = 240) -> list[str]:
    """Each rank's output; a rank that fails fails the test."""
    return [r.stdout for r in finish_ranks(procs, timeout)]


def lines(out: str, tag: str) -> list[dict]:
    return [json.loads(x.split(" ", 1)[1]) for x in out.splitlines() if x.startswith(tag + " ")]


BATCH = make_batch(0, 4, 4)  # four mixed groups
# Two ranks, two mini-batches of five groups: [0, 1, 2] and [3, 4]; the ranks take groups 0, 2 | 1 and 3 | 4.
RANKS_BATCH = make_batch(1, 5, 4)
# One update ahead of the stale batch's sampler: a rank 8 adapter's first Adam step at lr 0.05 moves a token's
# log-prob by up to 1.39 (stale_reference's max_abs_log_ratio from this module's lora_stale run; the test
# checks it is far above its tolerances).
STALE = make_batch(3, 4, 4)
STALE_CAP = 1.5  # below the largest of the stale batch's weights, so the cap acts there too
LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear", "modules_to_save": None}
SGD = {"extra_ds_config": {"optimizer": {"type": "SGD", "params": {"lr": SGD_LR}},
                           "zero_allow_untested_optimizer": True}, "lr": SGD_LR, "grad_clip": 1.0}


@pytest.fixture(scope="module")
def results(small_model, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("offpolicy")
    base = {"model_path": str(small_model), "zero_stage": 0, "micro_batch": 3}
    ranked = {**base, **SGD, "zero_stage": 2, "micro_batch": 4, "epochs": 2, "mini_batches": 2}
    two = start("ranks", {"out": str(tmp), "run": {"name": "two", "config": ranked, "batches": [RANKS_BATCH]}},
                tmp, world_size=2, threads=1)
    reference = is_cap_reference(small_model, BATCH)
    capped = {**BATCH, "rollout_logprobs": reference["rollout_logprobs"]}
    v0 = base_logprobs(small_model, [BATCH, STALE])
    runs = [
        {"name": "is_cap", "config": {**base, "is_cap": CAP, "measure_noise": False}, "batches": [capped],
         "without_logprobs": True},
        {"name": "on_policy", "config": {**base, "grad_clip": 0.0, "measure_noise": False}, "batches": [BATCH],
         "capture": True, "reference": True},
        {"name": "epochs_mini", "config": {**base, "lr": 0.05, "epochs": 2, "mini_batches": 2},
         "batches": [BATCH]},
        # Group 1 scores alike and is left out: 3 groups for 4 mini-batches.
        {"name": "few_groups", "config": {**base, "mini_batches": 4}, "batches": [make_batch(2, 4, 4, (1,))]},
        {"name": "ppo", "config": {**base, "algorithm": "ppo", "epochs": 2, "mini_batches": 2, "kl_coef": 0.01},
         "batches": [BATCH]},
        {"name": "one", "config": {**ranked, "zero_stage": 2}, "batches": [RANKS_BATCH]},
        # maxStaleness 1 with spec.lora: step 1 trains a batch of version 0 (the base) on version 0, step 2 a
        # batch of version 0 on version 1 (the adapter after step 1).
        {"name": "lora_stale",
         "config": {**base, "is_cap": STALE_CAP, "lr": 0.05, "measure_noise": False, "lora": LORA},
         "batches": [{**BATCH, "rollout_logprobs": v0[0]}, {**STALE, "rollout_logprobs": v0[1]}]},
    ]
    one = start("runs", {"out": str(tmp), "runs": runs}, tmp, world_size=1, threads=1)
    single, *ranks = finish(one) + finish(two)
    return {"runs": {r["name"]: r for r in lines(single, "RESULT")}, "ranks": [lines(o, "RANK")[0] for o in ranks],
            "reference": reference, "dir": tmp, "model": small_model, "v0": v0}


@pytest.mark.slow
def test_is_cap_weights_each_tokens_loss_as_the_reference(results):
    """Ratio 1 (one update), so the loss is sum min(pi_old / pi_behaviour, cap) (-A) / T; float32 learner
    against float64 reference."""
    stats, ref = results["runs"]["is_cap"]["stats"][0], results["reference"]
    assert stats["optimizer_steps"] == 1
    for key in ("loss", "grad_norm", "is_weight_mean"):
        assert stats[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key
    assert stats["is_truncated_fraction"] == pytest.approx(ref["is_truncated_fraction"])
    assert 0 < stats["is_truncated_fraction"] < 1


@pytest.mark.slow
def test_is_cap_without_rollout_logprobs_is_refused_naming_the_field(results):
    assert "spec.algorithm.isCap" in results["runs"]["is_cap"]["error"]


@pytest.mark.slow
def test_one_epoch_one_mini_batch_is_the_on_policy_step_bit_for_bit(results):
    run = results["runs"]["on_policy"]
    saved = torch.load(results["dir"] / "on_policy.pt")
    assert run["stats"][0]["optimizer_steps"] == 1 and "is_weight_mean" not in run["stats"][0]
    assert run["stats"][0]["loss"] == saved["reference_loss"]
    (grads,) = saved["grads"]
    assert sorted(grads) == sorted(saved["reference_grads"])
    for name, g in grads.items():
        assert torch.equal(g, saved["reference_grads"][name]), name


@pytest.mark.slow
def test_epochs_times_mini_batches_optimiser_steps_and_the_clip_acts(results):
    run = results["runs"]["epochs_mini"]
    stats = run["stats"][0]
    assert stats["optimizer_steps"] == 4 and run["optimizer_steps"] == 4 and run["steps"] == 1
    # A large learning rate moves pi past the clip range around pi_old within the step.
    assert stats["clip_fraction"] > 0
    assert math.isfinite(stats["loss"]) and math.isfinite(stats["grad_norm"])


@pytest.mark.slow
def test_fewer_trained_groups_than_mini_batches_take_one_step_per_group(results):
    run = results["runs"]["few_groups"]
    assert run["stats"][0]["samples_trained"] == 12.0
    assert run["stats"][0]["optimizer_steps"] == 3 == run["optimizer_steps"]


@pytest.mark.slow
def test_ppo_updates_policy_and_critic_per_mini_batch(results):
    stats = results["runs"]["ppo"]["stats"][0]
    assert stats["optimizer_steps"] == 4
    assert all(math.isfinite(stats[k]) for k in ("loss", "value_loss", "kl", "clip_fraction"))
    assert stats["value_loss"] > 0


@pytest.mark.slow
def test_two_ranks_take_the_same_optimiser_steps_and_end_with_one_ranks_weights(results):
    """ZeRO-2, two epochs of two mini-batches, SGD: two ranks (uneven shares, a placeholder micro-batch)
    and one rank on the whole batch differ only by float32 summation order."""
    ranks, one = results["ranks"], results["runs"]["one"]
    assert [r["optimizer_steps"] for r in ranks] == [4, 4] == [one["optimizer_steps"]] * 2
    two_stats, one_stats = ranks[0]["stats"][0], one["stats"][0]
    assert two_stats["optimizer_steps"] == one_stats["optimizer_steps"] == 4
    for key in ("loss", "grad_norm", "entropy"):
        assert two_stats[key] == pytest.approx(one_stats[key], rel=1e-4), key
    rank0, rank1 = (torch.load(results["dir"] / f"two-rank{r}.pt") for r in (0, 1))
    single = torch.load(results["dir"] / "one.pt")["params"]
    from transformers import AutoModelForCausalLM

    initial = dict(AutoModelForCausalLM.from_pretrained(results["model"]).named_parameters())
    for name, p in single.items():
        assert torch.equal(rank0[name], rank1[name]), name
        update = (p.double() - initial[name].detach().double()).norm().item()
        diff = (rank0[name].double() - p.double()).norm().item()
        assert diff <= 1e-4 * max(update, 1e-6), (name, diff, update)


@pytest.mark.slow
def test_lora_learner_weights_a_stale_batch_by_the_adapter_it_was_sampled_with(results):
    """spec.lora, algorithm.maxStaleness 1 and isCap: a batch sampled at weights version 0 and trained at
    version 1 gets each token's weight min(pi_v1 / pi_v0, cap), pi_v1 the learner's adapter after one update
    and pi_v0 the base (the fresh adapter), against float64 written out from the merged weights."""
    run, tmp = results["runs"]["lora_stale"], results["dir"]
    on_policy, stale = run["stats"]
    # Version 0 on version 0: the fresh adapter is the base the engines sampled with, every weight 1.
    assert on_policy["is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert on_policy["logprob_abs_diff"] < 1e-5 and on_policy["is_truncated_fraction"] == 0.0
    ref = stale_reference(results["model"], torch.load(tmp / "lora_stale-v1.pt"),
                          {**STALE, "rollout_logprobs": results["v0"][1]}, STALE_CAP)
    assert ref["max_abs_log_ratio"] > 0.05  # the batch is off-policy by far more than the tolerances below
    for key in ("loss", "is_weight_mean", "logprob_diff"):
        assert stale[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key
    assert stale["is_truncated_fraction"] == pytest.approx(ref["is_truncated_fraction"])
    assert 0 < stale["is_truncated_fraction"] < 1
    assert stale["is_weight_mean"] != pytest.approx(1.0, abs=1e-3)
    # The update trained the adapter: version 2 is not version 1.
    v1, v2 = torch.load(tmp / "lora_stale-v1.pt"), torch.load(tmp / "lora_stale-v2.pt")
    assert max(float((v2[k] - v1[k]).abs().max()) for k in v1) > 1e-4


def test_a_lora_spec_with_staleness_gives_the_learner_its_adapter_and_is_cap():
    """What the LoRA staleness test's learner is given, from a spec that validates (parse_spec runs the rules:
    maxStaleness > 0 is refused colocated, so this is the disaggregated case)."""
    from rlscale.spec import parse_spec
    from rlscale.trainer.learner_config import LearnerConfig

    spec = parse_spec({"model": {"path": "builtin:tiny-arith"}, "hardware": {"accelerator": "cpu"},
                       "placement": "disaggregated", "lora": {"rank": 8, "alpha": 16},
                       "algorithm": {"maxStaleness": 1, "isCap": 2.0}})
    config = LearnerConfig.from_spec(spec, "/nowhere")
    assert config.lora == LORA and config.is_cap == 2.0


def test_mini_batches_hold_whole_groups_as_even_as_possible():
    groups = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert mini_batch_groups(groups, 2) == [groups[:3], groups[3:]]
    assert mini_batch_groups(groups, 3) == [groups[:2], groups[2:4], groups[4:]]
    assert mini_batch_groups(groups, 1) == [groups]
    assert mini_batch_groups(groups[:2], 4) == [[groups[0]], [groups[1]]]  # never an empty mini-batch


def test_the_importance_weight_is_truncated_at_the_cap_and_carries_no_gradient():
    old = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    behaviour = torch.tensor([[-1.5, -1.0, -2.0]])
    weight, truncated = truncated_is_weight(old, behaviour, 2.0)
    assert torch.allclose(weight, torch.tensor([[math.exp(0.5), math.exp(-1.0), 2.0]]))
    assert truncated.tolist() == [[0.0, 0.0, 1.0]]
    assert not weight.requires_grad


def test_learner_config_reads_is_cap_epochs_and_mini_batches_from_the_spec():
    from rlscale.spec import parse_spec
    from rlscale.trainer.learner_config import LearnerConfig

    spec = parse_spec({"model": {"path": "builtin:tiny-arith"}, "hardware": {"accelerator": "cpu"},
                       "batch": {"prompts": 8, "samplesPerPrompt": 4, "minPrompts": 4},
                       "algorithm": {"isCap": 2.0, "epochs": 3, "miniBatches": 4}})
    config = LearnerConfig.from_spec(spec, "/nowhere")
    assert (config.is_cap, config.epochs, config.mini_batches) == (2.0, 3, 4)
    default = LearnerConfig.from_spec(parse_spec({"model": {"path": "builtin:tiny-arith"},
                                                  "hardware": {"accelerator": "cpu"}}), "/nowhere")
    assert (default.is_cap, default.epochs, default.mini_batches) == (None, 1, 1)
