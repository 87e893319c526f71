"""Learner ranks for tests/trainer/test_offpolicy.py, each its own process (DeepSpeed owns the process group).
Usage: python offpolicy_worker.py MODE ARGS_JSON, with RANK/WORLD_SIZE/MASTER_* in the env.

Modes: `runs` (one rank; one learner per entry of args["runs"], one after another, each stepping on its
batches; prints RESULT {json} per run, and saves parameters and captured gradients under args["out"]),
`ranks` (every rank builds the learner of args["run"]; rank 0 steps, the others follow; each rank prints
RANK {json} with its optimiser steps and saves its parameters).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from rlscale.trainer import algorithms as A
from rlscale.trainer import losses as L
from rlscale.trainer.batching import RolloutBatch, pack, plan_micro_batches
from rlscale.trainer.learner import Learner, LearnerConfig
from rlscale.trainer.logprobs import response_logprobs
from rlscale.trainer.lora.policy import merged_items


def params(module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def on_policy_step(config: dict, batch: dict) -> tuple[float, dict[str, torch.Tensor]]:
    """The learner's step as it was with one optimiser step per batch, written out for GRPO under
    token-mean without the noise measurement: the kept groups in the same micro-batches, ratio
    exp(logp - logp.detach()) = 1, each micro-batch's loss over the batch's token count, a backward per
    micro-batch on a plain model. Returns the reported loss and the accumulated gradient."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(config["model_path"], dtype=torch.float32, local_files_only=True)
    rb = RolloutBatch.from_dict(batch)
    spp = rb.samples_per_prompt
    rewards = torch.tensor(rb.rewards, dtype=torch.float32)
    advantages = A.grpo_advantages(rewards, spp)
    keep = A.groups_with_signal(rewards, spp)
    groups = [list(range(g, g + spp)) for g in range(0, len(rb), spp) if keep[g]]
    tokens = sum(len(rb.response_ids[i]) for g in groups for i in g)
    sequences = sum(len(g) for g in groups)
    lengths = [len(p) + len(r) for p, r in zip(rb.prompt_ids, rb.response_ids, strict=True)]
    total = 0.0
    for idx in plan_micro_batches(groups, 0, 1, lengths, config["micro_batch"]).chunks:
        mb = pack(rb, idx, advantages, "cpu", rewards=rewards)
        logprobs, _ = response_logprobs(model, mb, config.get("logprob_chunk", 1024))
        per_token, _ = A.token_policy_loss(logprobs, logprobs.detach(), mb.advantages, clip_low=0.2)
        loss = L.aggregate(per_token, mb.mask, "token-mean", tokens=tokens, sequences=sequences)
        loss.backward()
        total = total + loss.item() * tokens
    return total / tokens, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def one_run(run: dict, out: Path) -> dict:
    learner = Learner(LearnerConfig(**run["config"]))
    seen: list[dict[str, torch.Tensor]] = []
    if run.get("capture"):
        named = list(learner.engine.module.named_parameters())

        def capture(*_):
            # ZeRO 0, float32, no clip: the plain torch optimiser; p.grad is the whole gradient here.
            seen.append({n: p.grad.detach().clone() for n, p in named if p.grad is not None})

        learner.engine.optimizer.register_step_pre_hook(capture)
    result: dict = {"name": run["name"], "stats": []}
    if run.get("without_logprobs"):
        bare = {k: v for k, v in run["batches"][0].items() if k != "rollout_logprobs"}
        try:
            learner.step(bare)
        except ValueError as exc:
            result["error"] = str(exc)
    for k, batch in enumerate(run["batches"]):
        result["stats"].append(learner.step(batch))
        if learner.lora is not None:  # the policy after step k as the engines get it: the adapter merged in
            torch.save(dict(merged_items(learner.lora)), out / f"{run['name']}-v{k + 1}.pt")
    result["optimizer_steps"], result["steps"] = learner.optimizer_steps, learner.steps
    saved = {"params": params(learner.engine.module), "grads": seen}
    if run.get("reference"):
        saved["reference_loss"], saved["reference_grads"] = on_policy_step(run["config"], run["batches"][0])
    torch.save(saved, out / f"{run['name']}.pt")
    learner.shutdown()
    return result


def runs(args: dict) -> None:
    out = Path(args["out"])
    for run in args["runs"]:
        print("RESULT " + json.dumps(one_run(run, out)), flush=True)


def ranks(args: dict) -> None:
    run, out = args["run"], Path(args["out"])
    learner = Learner(LearnerConfig(**run["config"]))
    stats = []
    if learner.rank == 0:
        stats = [learner.step(batch) for batch in run["batches"]]
        learner.shutdown()
    else:
        learner.follow()
    print("RANK " + json.dumps({"rank": learner.rank, "optimizer_steps": learner.optimizer_steps, "stats": stats}),
          flush=True)
    torch.save(params(learner.engine.module), out / f"{run['name']}-rank{learner.rank}.pt")


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("WORKER_THREADS", "1")))
    mode, args_json = sys.argv[1], sys.argv[2]
    {"runs": runs, "ranks": ranks}[mode](json.loads(Path(args_json).read_text()))
