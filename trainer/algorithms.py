"""GRPO and PPO as pure tensor functions: advantages, losses, KL and entropy (the other advantage
estimators are rlscale.trainer.advantages, the loss aggregations and GSPO rlscale.trainer.losses).

Shapes: per-token tensors are [batch, response_len] with a 0/1 `mask` over real
response tokens; per-sample tensors are [batch]. Samples of one GRPO group are
contiguous (prompt 0's samples first, then prompt 1's, ...).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlscale.spec.algorithm import KL_ESTIMATORS


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of x where mask is 1."""
    return (x * mask).sum() if dim is None else (x * mask).sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None, denom: float | None = None) -> Tensor:
    """Mean of x over mask; `denom` overrides the token count (e.g. the whole batch's)."""
    if denom is not None:
        return masked_sum(x, mask, dim) / denom
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


# --- GRPO (Shao et al. 2024, DeepSeekMath) ---------------------------------------


def grpo_advantages(
    rewards: Tensor, group_size: int, *, normalize_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """A_i = (r_i - mean(group)) / (std(group) + eps); without std normalisation (Dr. GRPO), r_i - mean."""
    if rewards.numel() % group_size:
        raise ValueError(
            f"grpo_advantages: {rewards.numel()} rewards are not a whole number of groups of "
            f"{group_size}; pass rewards for prompts x samples_per_prompt samples"
        )
    groups = rewards.view(-1, group_size).float()
    centered = groups - groups.mean(dim=1, keepdim=True)
    if normalize_std:
        # Unbiased std, as in the GRPO paper's reference implementation. A group of
        # equal rewards carries no signal: its advantage is 0 even with eps = 0.
        std = groups.std(dim=1, keepdim=True, unbiased=group_size > 1)
        centered = torch.where(std > 0, centered / (std + eps), torch.zeros_like(centered))
    return centered.view(-1)


def groups_with_signal(rewards: Tensor, group_size: int) -> Tensor:
    """Per-sample bool: True where the sample's group has rewards that are not all equal."""
    groups = rewards.view(-1, group_size)
    varied = (groups.max(dim=1).values - groups.min(dim=1).values) > 0
    return varied.repeat_interleave(group_size)


def mixed_group_fraction(rewards: Tensor, group_size: int) -> float:
    """The share of groups whose rewards are not all equal: the groups GRPO learns from."""
    return groups_with_signal(rewards, group_size).float().mean().item() if rewards.numel() else 0.0


# --- PPO (Schulman et al. 2017; GAE: Schulman et al. 2016) -----------------------


def gae(
    rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float = 1.0, lam: float = 0.95
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over response tokens; returns (advantages, returns).

    delta_t = r_t + gamma * V_{t+1} - V_t and A_t = delta_t + gamma * lam * A_{t+1}, with
    V and A taken as 0 past the last real token (the episode ends there).
    """
    rewards, values, mask = rewards.float(), values.float() * mask, mask.float()
    batch, length = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(batch, dtype=rewards.dtype, device=rewards.device)
    next_adv = torch.zeros_like(next_value)
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        m = mask[:, t]
        advantages[:, t] = adv * m
        # Masked positions are skipped: padding after the end carries nothing back (the zeros it starts from),
        # a tool's observation between two turns carries the later turn's value and advantage through to the
        # earlier turn, as if the model's tokens were one sequence.
        next_value = torch.where(m > 0, values[:, t], next_value)
        next_adv = torch.where(m > 0, adv, next_adv)
    returns = (advantages + values) * mask
    return advantages, returns


def token_rewards(final_rewards: Tensor, mask: Tensor, kl: Tensor | None = None, kl_coef: float = 0.0) -> Tensor:
    """Per-token PPO rewards: the sequence reward on the last real token, minus kl_coef x KL."""
    # The last masked position (a multi-turn response has masked observation tokens inside it).
    lengths = mask.long().sum(dim=1)
    positions = torch.arange(mask.shape[1], device=mask.device)
    last = ((mask > 0).long() * (positions + 1)).max(dim=1).values - 1
    rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards[rows, last.clamp(min=0)] = final_rewards.float() * (lengths > 0)
    if kl is not None and kl_coef:
        rewards = rewards - kl_coef * kl * mask
    return rewards


def whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """Normalise x to zero mean and unit variance over the masked entries."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return (x - mean) * torch.rsqrt(var + eps) * mask


# --- Losses ----------------------------------------------------------------------


def token_policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, *, clip_low: float = 0.2,
                      clip_high: float | None = None) -> tuple[Tensor, Tensor]:
    """Per-token PPO clipped surrogate, before any aggregation, and where the clipped side won.

    l_t = max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high)), r_t = exp(logp_t - logp_old_t);
    `advantages` may be per sample [B] (broadcast over the tokens) or per token [B, T].
    """
    clip_high = clip_low if clip_high is None else clip_high
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).float()


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    denom: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate, token-level masked mean; clip_high != clip_low is DAPO's asymmetric clip.

    L = mean_t max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high)), r_t = exp(logp - logp_old).
    `advantages` may be per sample [B] (GRPO) or per token [B, T] (PPO). The other aggregations of the
    per-token loss are rlscale.trainer.losses.aggregate.
    """
    per_token, clipped = token_policy_loss(logprobs, old_logprobs, advantages, clip_low=clip_low, clip_high=clip_high)
    loss = masked_mean(per_token, mask, denom=denom)
    with torch.no_grad():
        clipfrac = masked_mean(clipped, mask)
        approx_kl = masked_mean(old_logprobs - logprobs, mask)
    return loss, {"clipfrac": clipfrac, "approx_kl": approx_kl}


def outside_clip(logprobs: Tensor, behaviour_logprobs: Tensor, *, clip_low: float = 0.2,
                 clip_high: float | None = None) -> Tensor:
    """Per token, 1.0 where the ratio pi / pi_behaviour lies outside [1 - clip_low, 1 + clip_high]."""
    clip_high = clip_low if clip_high is None else clip_high
    ratio = torch.exp(logprobs.detach().float() - behaviour_logprobs.float())
    return ((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)).float()


def value_loss_tokens(values: Tensor, old_values: Tensor, returns: Tensor, *, clip: float | None = 0.2) -> Tensor:
    """Per-token clipped value loss: 0.5 * max((V - R)^2, (V_old + clip(V - V_old, +-clip) - R)^2)."""
    loss = (values - returns) ** 2
    if clip is not None:
        clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        loss = torch.maximum(loss, (clipped - returns) ** 2)
    return 0.5 * loss


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None = 0.2,
    denom: float | None = None,
) -> Tensor:
    """Clipped value loss: 0.5 * max((V - R)^2, (V_old + clip(V - V_old, +-clip) - R)^2), masked mean."""
    return masked_mean(value_loss_tokens(values, old_values, returns, clip=clip), mask, denom=denom)


def kl_divergence(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL(pi || pi_ref) estimators from samples of pi (Schulman, "Approximating KL").

    With x = log pi - log pi_ref: k1 = x (unbiased, can be negative); k2 = x^2 / 2 (biased, >= 0, low
    variance; its gradient is that of the true KL); k3 = exp(-x) - 1 + x (unbiased, >= 0).
    """
    log_ratio = logprobs - ref_logprobs
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind == "k3":
        return torch.exp(-log_ratio) - 1.0 + log_ratio
    raise ValueError(f"kl estimator: {kind!r} is not known; use one of {', '.join(KL_ESTIMATORS)}")


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Per-position entropy of softmax(logits): logsumexp(z) - sum softmax(z) z."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def token_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """log softmax(logits)[token] at each position, computed in float32."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
