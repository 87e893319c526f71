"""A plain in-process sampler with HF generate: warm-start evals, tests and the benchmark.

The product's rollouts come from vLLM (rlscale.rollout); this is the reference path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlscale.trainer.rewards import RewardFn, strict_match
from rlscale.trainer.tasks import Problem


@dataclass
class Completion:
    """One sampled response: token ids without padding, and whether it ended with EOS."""

    prompt_ids: list[int]
    response_ids: list[int]
    text: str
    finished: bool
    logprobs: list[float] | None = None


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list[str],
    *,
    samples_per_prompt: int = 1,
    max_new_tokens: int = 8,
    temperature: float = 1.0,
    greedy: bool = False,
    seed: int | None = None,
) -> list[Completion]:
    """Sample `samples_per_prompt` responses per prompt; output is grouped prompt by prompt."""
    was_training = model.training
    model.eval()
    expanded = [p for p in prompts for _ in range(samples_per_prompt)]
    enc = tokenizer(expanded, return_tensors="pt", padding=True)
    if seed is not None:
        torch.manual_seed(seed)
    device = next(model.parameters()).device
    kwargs = ({"do_sample": False} if greedy
              else {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0})
    out = model.generate(
        input_ids=enc.input_ids.to(device),
        attention_mask=enc.attention_mask.to(device),
        max_new_tokens=max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **kwargs,
    )
    model.train(was_training)
    prompt_len = enc.input_ids.shape[1]
    completions = []
    for row, mask in zip(out.tolist(), enc.attention_mask.tolist(), strict=True):
        prompt_ids = [t for t, m in zip(row[:prompt_len], mask, strict=True) if m]
        response = row[prompt_len:]
        finished = tokenizer.eos_token_id in response
        if finished:
            response = response[: response.index(tokenizer.eos_token_id) + 1]
        else:
            response = [t for t in response if t != tokenizer.pad_token_id]
        text = tokenizer.decode(response, skip_special_tokens=True)
        completions.append(Completion(prompt_ids, response, text, finished))
    return completions


def accuracy(
    model,
    tokenizer,
    problems: list[Problem],
    *,
    max_new_tokens: int = 8,
    reward: RewardFn = strict_match,
    batch_size: int = 500,
) -> float:
    """Greedy held-out accuracy: the share of problems whose reward is 1."""
    correct = 0.0
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        outs = generate(model, tokenizer, [p.prompt for p in chunk], max_new_tokens=max_new_tokens, greedy=True)
        correct += sum(
            reward(p.prompt, o.text, p.answer, finished=o.finished) >= 1.0 for p, o in zip(chunk, outs, strict=True)
        )
    return correct / max(len(problems), 1)
