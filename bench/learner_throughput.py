"""Learner throughput: the DeepSpeed learner vs a plain PyTorch loop on the same model and batch.

Baseline: a plain PyTorch GRPO step (same micro-batches with gradient accumulation,
same loss, AdamW, gradient clipping) in the same process; steps alternate between the
two so a noisy machine slows both alike. Also prints the builtin model's warm-start time.

    .venv/bin/python bench/learner_throughput.py                 # CPU, builtin:tiny-arith shape
    .venv/bin/python bench/learner_throughput.py --warm-start     # also warm-start a fresh copy
    .venv/bin/python bench/learner_throughput.py --hidden 1024 --layers 16   # larger, e.g. on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "rlscale" / "torch_extensions"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--dtype", default=None, help="float32 on CPU, bfloat16 on GPU by default")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--samples-per-prompt", type=int, default=8)
    p.add_argument("--response-tokens", type=int, default=4, help="mean response length (the task's)")
    p.add_argument("--micro-batch", type=int, default=32)
    p.add_argument("--zero-stage", type=int, default=1)
    p.add_argument("--steps", type=int, default=20, help="measured steps per side, after 3 warm-up steps")
    p.add_argument("--warm-start", action="store_true", help="time a fresh warm start of builtin:tiny-arith")
    p.add_argument("--json", type=Path, help="also write the results here")
    return p.parse_args(argv)


def make_batch(prompts: int, spp: int, response_tokens: int, seed: int = 0) -> dict:
    """Arithmetic-shaped samples: '<bos>dd+dd=' prompts, 1..2*mean-1 digit responses + EOS, mixed rewards."""
    rng = random.Random(seed)
    prompt_ids, response_ids, rewards = [], [], []
    for _ in range(prompts):
        p = [1, rng.randrange(5, 14), rng.randrange(4, 14), 14, rng.randrange(5, 14), rng.randrange(4, 14), 16]
        for _ in range(spp):
            prompt_ids.append(p)
            n = rng.randrange(1, 2 * response_tokens - 1)
            response_ids.append([rng.randrange(4, 14) for _ in range(n - 1)] + [2])
            rewards.append(float(rng.random() < 0.5))
    return {"prompt_ids": prompt_ids, "response_ids": response_ids, "rewards": rewards, "samples_per_prompt": spp}


class PlainLoop:
    """The baseline: the same GRPO step written directly in PyTorch."""

    def __init__(self, model_path: str, dtype: torch.dtype, micro_batch: int, device):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, betas=(0.9, 0.99))
        self.micro_batch = micro_batch
        self.device = device

    def step(self, batch: dict) -> None:
        from rlscale.trainer import algorithms as A
        from rlscale.trainer.batching import RolloutBatch, micro_batches, pack

        rb = RolloutBatch.from_dict(batch)
        rewards = torch.tensor(rb.rewards)
        adv = A.grpo_advantages(rewards, rb.samples_per_prompt)
        kept = A.groups_with_signal(rewards, rb.samples_per_prompt).nonzero().flatten().tolist()
        total = sum(len(rb.response_ids[i]) for i in kept)
        self.opt.zero_grad(set_to_none=True)
        for idx in micro_batches(kept, self.micro_batch, -(-len(kept) // self.micro_batch)):
            mb = pack(rb, idx, adv, self.device)
            logits = self.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
            resp = logits.gather(1, mb.logit_index.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
            logp = A.token_logprobs(resp, mb.response)
            loss, _ = A.policy_loss(logp, logp.detach(), mb.advantages, mb.mask, denom=total)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None) -> int:
    args = parse_args(argv)
    from rlscale.trainer.learner import Learner, LearnerConfig
    from rlscale.trainer.modeling import save_random_model

    on_gpu = torch.cuda.is_available()
    dtype_name = args.dtype or ("bfloat16" if on_gpu else "float32")
    tmp = Path(tempfile.mkdtemp(prefix="rlscale-bench-"))
    model_path = save_random_model(tmp / "model", hidden_size=args.hidden, num_layers=args.layers,
                                   num_heads=args.hidden // 64, head_dim=64, intermediate_size=args.intermediate,
                                   dtype=dtype_name)
    t0 = time.perf_counter()
    learner = Learner(LearnerConfig(model_path=str(model_path), dtype=dtype_name, zero_stage=args.zero_stage,
                                    micro_batch=args.micro_batch, lr=1e-4, betas=(0.9, 0.99)))
    init_s = time.perf_counter() - t0
    plain = PlainLoop(str(model_path), getattr(torch, dtype_name), args.micro_batch, learner.device)
    batches = [make_batch(args.prompts, args.samples_per_prompt, args.response_tokens, seed=s) for s in range(4)]
    tokens = [sum(len(p) + len(r) for p, r in zip(b["prompt_ids"], b["response_ids"], strict=True)) for b in batches]

    times = {"deepspeed": [], "plain": []}
    for i in range(3 + args.steps):
        b = i % len(batches)
        order = [("deepspeed", learner.step), ("plain", plain.step)]
        for name, fn in order if i % 2 == 0 else reversed(order):
            sync(learner.device)
            t = time.perf_counter()
            fn(batches[b])
            sync(learner.device)
            if i >= 3:
                times[name].append((time.perf_counter() - t, tokens[b]))

    # Medians and per-pair ratios: a burst of load from other processes on a shared machine
    # hits single steps, and would dominate sums.
    med_ds = statistics.median(t for t, _ in times["deepspeed"])
    med_pl = statistics.median(t for t, _ in times["plain"])
    mean_tokens = statistics.mean(n for _, n in times["deepspeed"])
    ds, pl = mean_tokens / med_ds, mean_tokens / med_pl
    ratio = statistics.median(d / p for (d, _), (p, _) in zip(times["deepspeed"], times["plain"], strict=True))
    n_params = sum(p.numel() for p in plain.model.parameters())
    result = {
        "device": str(learner.device), "dtype": dtype_name, "params": n_params, "zero_stage": args.zero_stage,
        "batch": f"{args.prompts}x{args.samples_per_prompt}", "micro_batch": args.micro_batch,
        "learner_tokens_per_second": ds, "plain_tokens_per_second": pl,
        "time_ratio_learner_over_plain": ratio,
        "median_step_seconds": {"learner": med_ds, "plain": med_pl}, "learner_init_seconds": init_s,
    }
    print(f"model: {n_params / 1e6:.2f}M params, {dtype_name} on {learner.device}; batch {result['batch']}, "
          f"micro-batch {args.micro_batch}, ZeRO stage {args.zero_stage}")
    print(f"learner (DeepSpeed): {ds:,.0f} tokens/s   median step {med_ds * 1e3:.1f} ms")
    print(f"plain PyTorch loop:  {pl:,.0f} tokens/s   median step {med_pl * 1e3:.1f} ms")
    print(f"ratio: the learner takes {ratio:.2f}x the plain loop's time for the same batch "
          "(median of per-step pairs; target < 1.25x)")
    print(f"learner start-up (DeepSpeed initialize): {init_s:.1f} s")
    learner.shutdown()

    result["warm_start"] = warm_start_figures(args.warm_start)
    ws = result["warm_start"]
    if ws:
        print(f"warm start of builtin:tiny-arith: {ws['seconds']:.0f} s, {ws['steps']} steps, held-out accuracy "
              f"{ws['accuracy']:.1%} ({ws['source']})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


def warm_start_figures(fresh: bool) -> dict | None:
    """Time a fresh warm start, or read the one recorded when the cached model was built."""
    from rlscale.trainer.builtin import TINY_ARITH, builtin_model_dir, warm_start

    if fresh:
        info = warm_start(Path(tempfile.mkdtemp(prefix="rlscale-ws-")), TINY_ARITH, progress=True)
        return {**info, "source": "measured now"}
    marker = builtin_model_dir("builtin:tiny-arith") / "rlscale-builtin.json"
    if not marker.is_file():
        print("warm start: builtin:tiny-arith is not cached yet; run with --warm-start to time it")
        return None
    info = json.loads(marker.read_text())
    return {**info, "source": f"recorded when {marker.parent} was built"}


if __name__ == "__main__":
    raise SystemExit(main())
