"""Advantage estimators besides GRPO's and PPO's (those are in rlscale.trainer.algorithms), and DAPO's
soft overlong penalty on the rewards: pure tensor functions.

Shapes as in rlscale.trainer.algorithms: per-sample tensors are [batch] with the samples of one
prompt group contiguous; per-token tensors are [batch, response_len] with a 0/1 `mask`.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _groups(rewards: Tensor, group_size: int, who: str) -> Tensor:
    if rewards.numel() % group_size:
        raise ValueError(f"{who}: {rewards.numel()} rewards are not a whole number of groups of {group_size}; "
                         "pass rewards for prompts x samples_per_prompt samples")
    return rewards.float().view(-1, group_size)


# --- RLOO (Kool et al. 2019; Ahmadian et al. 2024) --------------------------------


def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """Leave-one-out baseline: A_i = r_i - 1/(k-1) * sum_{j != i} r_j over the k samples of i's group.

    Equal to k/(k-1) * (r_i - mean(group)): GRPO's centring without the std division, scaled so
    that the baseline of each sample does not include that sample.
    """
    if group_size < 2:
        raise ValueError(f"rloo_advantages: a group of {group_size} has no other sample to be the baseline; "
                         "use samples_per_prompt >= 2")
    groups = _groups(rewards, group_size, "rloo_advantages")
    others = (groups.sum(dim=1, keepdim=True) - groups) / (group_size - 1)
    return (groups - others).view(-1)


# --- REINFORCE++ (Hu et al. 2025) --------------------------------------------------


def weighted_whiten(values: Tensor, weights: Tensor, eps: float = 1e-8) -> Tensor:
    """(v_i - mu) / sqrt(var + eps), mu = sum_i w_i v_i / W and var = sum_i w_i (v_i - mu)^2 / W, W = sum_i w_i.

    With w_i the number of sample i's tokens in the loss this is the batch's token-level whitening
    of a per-sample value (every token of sample i carries v_i); a sample of weight 0 gets 0.
    """
    values, weights = values.double(), weights.double()
    total = weights.sum().clamp(min=1e-12)
    mean = (weights * values).sum() / total
    var = (weights * (values - mean) ** 2).sum() / total
    out = (values - mean) * torch.rsqrt(var + eps)
    return torch.where(weights > 0, out, torch.zeros_like(out)).float()


def reinforce_pp_baseline_advantages(rewards: Tensor, group_size: int, token_counts: Tensor,
                                     eps: float = 1e-8) -> Tensor:
    """REINFORCE++-baseline: the group mean as baseline, then batch normalisation.

    c_i = r_i - mean(group of i); A_i = (c_i - mu) / sqrt(var + eps) with mu and var the mean and
    variance of c over every token of the batch (sample i counts token_counts[i] times; 0 leaves it out).
    """
    groups = _groups(rewards, group_size, "reinforce_pp_baseline_advantages")
    centred = (groups - groups.mean(dim=1, keepdim=True)).view(-1)
    return weighted_whiten(centred, token_counts, eps)


def reward_to_go(token_rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """Per-token discounted return G_t = sum_{s >= t} gamma^(s-t) r_s over the masked tokens (0 elsewhere;
    s runs over masked tokens only, so observation tokens between two turns neither add nor discount)."""
    token_rewards, mask = token_rewards.float(), mask.float()
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype, device=token_rewards.device)
    for t in reversed(range(token_rewards.shape[1])):
        m = mask[:, t]
        # A masked position passes the return through (a tool's observation between turns), 0 after the end.
        running = torch.where(m > 0, token_rewards[:, t] + gamma * running, running)
        returns[:, t] = running * m
    return returns


def token_moments(x: Tensor, mask: Tensor) -> Tensor:
    """[sum x, sum x^2, token count] over the masked entries, in float64: summed over the parts of a
    batch (micro-batches, ranks) they give the whole batch's mean and variance (see whiten_by)."""
    x, mask = x.double(), mask.double()
    return torch.stack([(x * mask).sum(), (x * x * mask).sum(), mask.sum()])


def whiten_by(x: Tensor, mask: Tensor, moments: Tensor, eps: float = 1e-8) -> Tensor:
    """(x - mu) / sqrt(var + eps) on the masked entries, mu and var from a batch's summed token_moments."""
    total, total_sq, count = moments.double().tolist()
    count = max(count, 1.0)
    mean = total / count
    var = max(total_sq / count - mean * mean, 0.0)
    return ((x.float() - mean) / (var + eps) ** 0.5) * mask.float()


# --- DAPO (Yu et al. 2025): soft overlong punishment ---------------------------------


def overlong_penalty(lengths: Tensor, max_length: int, buffer: int, factor: float = 1.0) -> Tensor:
    """DAPO's length penalty, added to the reward of each sample with |y| response tokens:

    0 if |y| <= L_max - L_cache; factor * ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max;
    -factor beyond L_max. L_max = max_length (the longest response), L_cache = buffer.
    """
    if not 0 < buffer <= max_length:
        raise ValueError(f"overlong_penalty: buffer {buffer} must lie in (0, max_length={max_length}]")
    expected = max_length - buffer
    over = (lengths.float() - expected).clamp(min=0.0)
    return -factor * torch.clamp(over / buffer, max=1.0)


def training_rewards(rewards: Tensor, lengths: Tensor, *, max_length: int | None = None, buffer: int = 0,
                     factor: float = 1.0) -> Tensor:
    """The rewards the advantages are computed from: the task's, plus the overlong penalty when buffer > 0."""
    rewards = rewards.float()
    if buffer <= 0:
        return rewards
    if max_length is None:
        raise ValueError("training_rewards: the overlong penalty needs max_length (task.maxNewTokens)")
    return rewards + overlong_penalty(lengths, max_length, buffer, factor)
