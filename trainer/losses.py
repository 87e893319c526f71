"""How a per-token loss becomes one number (the aggregation modes), and GSPO's sequence-level policy
loss: pure tensor functions. The token-level clipped surrogate is rlscale.trainer.algorithms.

Shapes: per-token tensors are [batch, response_len] with a 0/1 `mask` over the response tokens
that enter the loss; per-sample tensors are [batch].
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlscale.spec.algorithm import LOSS_AGGREGATIONS  # verl's loss_agg_mode names
from rlscale.trainer.algorithms import masked_sum


def aggregate(loss: Tensor, mask: Tensor, mode: str = "token-mean", *, tokens: float | None = None,
              sequences: float | None = None, max_length: int | None = None) -> Tensor:
    """One loss from per-token losses l_{i,t}, over S sequences with |y_i| tokens each, T = sum_i |y_i|:

    token-mean:              sum_{i,t} l_{i,t} / T  (every token weighs the same; DAPO, verl's default)
    seq-mean-token-mean:     1/S sum_i (1/|y_i| sum_t l_{i,t})  (every sequence weighs the same; GRPO's paper)
    seq-mean-token-sum-norm: sum_{i,t} l_{i,t} / (S * L_max)  (Dr. GRPO's constant normaliser, L_max the
                             longest response allowed)

    When a batch's loss is summed over parts (micro-batches, ranks), `tokens` and `sequences` are the
    whole batch's T and S (default: this tensor's), so that the parts add up to the batch's loss.
    """
    if mode == "token-mean":
        return masked_sum(loss, mask) / (tokens if tokens is not None else mask.sum().clamp(min=1))
    count = sequences if sequences is not None else (mask.sum(dim=1) > 0).sum().clamp(min=1)
    if mode == "seq-mean-token-mean":
        per_sequence = masked_sum(loss, mask, dim=1) / mask.sum(dim=1).clamp(min=1)
        return per_sequence.sum() / count
    if mode == "seq-mean-token-sum-norm":
        if not max_length:
            raise ValueError("aggregate: seq-mean-token-sum-norm needs max_length (task.maxNewTokens)")
        return masked_sum(loss, mask) / (count * max_length)
    raise ValueError(f"spec.algorithm.lossAggregation: {mode!r} is not known; use one of "
                     f"{', '.join(LOSS_AGGREGATIONS)}")


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per sequence, the length-normalised log ratio 1/|y_i| sum_t (log pi - log pi_old) [B]."""
    return masked_sum(logprobs - old_logprobs, mask, dim=1) / mask.sum(dim=1).clamp(min=1)


def gspo_policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
                     clip_low: float = 0.2, clip_high: float | None = None) -> tuple[Tensor, Tensor]:
    """GSPO (Zheng et al. 2025): a sequence-level importance ratio, clipped at the sequence level.

    s_i = exp(1/|y_i| sum_t (log pi(y_{i,t}) - log pi_old(y_{i,t}))), the geometric mean of the token
    ratios; L_i = max(-A_i s_i, -A_i clip(s_i, 1 - clip_low, 1 + clip_high)). Returns [B, T] with L_i on
    every token of sequence i (so seq-mean-token-mean gives GSPO's 1/S sum_i L_i), and 1.0 on the
    tokens of sequences where the clipped side won. `advantages` are per sample [B].
    """
    clip_high = clip_low if clip_high is None else clip_high
    if advantages.dim() != 1:
        raise ValueError("gspo_policy_loss: advantages must be per sample [B]; GSPO has one ratio per sequence")
    ratio = torch.exp(sequence_log_ratio(logprobs, old_logprobs, mask))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_sequence = torch.maximum(unclipped, clipped)
    ones = torch.ones_like(logprobs)
    return per_sequence.unsqueeze(1) * ones, (clipped > unclipped).float().unsqueeze(1) * ones


def sequence_outside_clip(logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, *, clip_low: float = 0.2,
                          clip_high: float | None = None) -> Tensor:
    """Per token, 1.0 where its sequence's ratio s_i to the sampling policy lies outside
    [1 - clip_low, 1 + clip_high] (GSPO's clip fraction, counted in tokens)."""
    clip_high = clip_low if clip_high is None else clip_high
    with torch.no_grad():
        ratio = torch.exp(sequence_log_ratio(logprobs.detach().float(), behaviour_logprobs.float(), mask))
        outside = ((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)).float()
    return outside.unsqueeze(1) * torch.ones_like(logprobs, dtype=torch.float32)
