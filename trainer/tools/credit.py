"""Per-turn credit for a multi-turn trajectory (spec.task.turnCredit: rewardToGo): each model turn's tokens get
the return from that turn on, instead of every token getting the trajectory's reward. Pure functions.

A trajectory of K model turns has the environment's reward r_k for each turn k (its step() after the turn)
and a training reward `total` (task.reward's score plus every r_k, plus DAPO's overlong penalty when set).
What is not a step reward, R = total - sum_k r_k, arrives with the last turn. The return of turn k is

    G_k = r_k + d * G_{k+1},  G_{K-1} = r_{K-1} + R      (d = task.turnDiscount; with d = 1, G_0 = total)

Group algorithms (grpo, rloo, reinforce++-baseline) compare G_k with the returns of the same turn index k in
the prompt's group (the samples that reached turn k): the baseline of a turn is what the other samples made
from the same point of the episode, as MT-GRPO (Zeng et al. 2025, turn-level credit assignment) normalises
turn-level rewards. Turn 0 is then the algorithm's usual advantage of the trajectory's return. A turn index
only one sample of its group reached has no baseline and gets 0 (as a group of equal rewards does).
PPO and REINFORCE++ place r_k on turn k's last model token and R on the last one instead (step_token_rewards);
their per-token returns (GAE, reward-to-go, discounted by algorithm.gamma) do the rest.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from rlscale.trainer.advantages import weighted_whiten


def turn_returns(total: float, step_rewards: Sequence[float], discount: float = 1.0) -> list[float]:
    """G_k for each turn (module docstring); [] for a trajectory with no turn."""
    out = [0.0] * len(step_rewards)
    later = float(total) - float(sum(step_rewards))  # what is not a step reward comes with the last turn
    for k in reversed(range(len(step_rewards))):
        out[k] = float(step_rewards[k]) + later
        later = discount * out[k]
    return out


def turn_spans(starts: Sequence[int], length: int) -> list[tuple[int, int]]:
    """[start, end) of each turn in a response of `length` tokens: a turn runs to the next turn's start (its
    observation tokens included; the mask leaves those out of the loss)."""
    ends = list(starts[1:]) + [length]
    return list(zip(starts, ends, strict=True))


def _baselined(values: list[float], how: str, eps: float) -> list[float]:
    """One turn index's returns in one group, against each other (module docstring)."""
    n = len(values)
    if n < 2:
        return [0.0] * n
    mean = sum(values) / n
    centred = [v - mean for v in values]
    if how == "rloo":  # r_i - mean of the others = n/(n-1) (r_i - mean)
        return [c * n / (n - 1) for c in centred]
    if how == "grpo":
        std = (sum(c * c for c in centred) / (n - 1)) ** 0.5  # unbiased, as rlscale.trainer.algorithms.grpo_advantages
        return [c / (std + eps) for c in centred] if std > 0 else [0.0] * n
    if how == "centred":
        return centred
    raise ValueError(f"turn credit: baseline {how!r} is not one of grpo, rloo, centred")


def group_turn_advantages(returns: Sequence[Sequence[float]], group_size: int, how: str,
                          eps: float = 1e-6) -> tuple[list[list[float]], list[bool]]:
    """Each sample's per-turn advantages, baselined per prompt group and turn index (`how`: grpo, the
    unnormalised centred returns, or rloo's leave-one-out), and per group whether any turn index's returns
    differ (the group has something to teach)."""
    if len(returns) % group_size:
        raise ValueError(f"turn credit: {len(returns)} samples are not a whole number of groups of {group_size}")
    out = [[0.0] * len(r) for r in returns]
    signal = []
    for g in range(0, len(returns), group_size):
        members = range(g, g + group_size)
        varied = False
        for k in range(max((len(returns[i]) for i in members), default=0)):
            have = [i for i in members if len(returns[i]) > k]
            values = [float(returns[i][k]) for i in have]
            varied = varied or (len(values) > 1 and max(values) > min(values))
            for i, a in zip(have, _baselined(values, how, eps), strict=True):
                out[i][k] = a
        signal.append(varied)
    return out, signal


def per_token(per_turn: Sequence[Sequence[float]], starts: Sequence[Sequence[int]], lengths: Sequence[int]) -> Tensor:
    """[batch, longest response]: each turn's value on every position of its span (0 past a response's end)."""
    out = torch.zeros(len(lengths), max(lengths, default=0), dtype=torch.float32)
    for i, (values, s, n) in enumerate(zip(per_turn, starts, lengths, strict=True)):
        for value, (a, b) in zip(values, turn_spans(s, n), strict=True):
            out[i, a:b] = value
    return out


def whitened_turns(centred: Sequence[Sequence[float]], starts: Sequence[Sequence[int]],
                   masks: Sequence[Sequence[int]], weights: Sequence[float]) -> list[list[float]]:
    """REINFORCE++-baseline's batch whitening of per-turn values: mean and variance over every model token of
    the samples with weight 1 (each turn's value counts once per model token of the turn)."""
    values, counts, where = [], [], []
    for i, (c, s, m) in enumerate(zip(centred, starts, masks, strict=True)):
        for k, (a, b) in enumerate(turn_spans(s, len(m))):
            values.append(c[k])
            counts.append(float(sum(m[a:b])) * weights[i])
            where.append((i, k))
    out = [[0.0] * len(c) for c in centred]
    if not values:
        return out
    white = weighted_whiten(torch.tensor(values, dtype=torch.float64), torch.tensor(counts, dtype=torch.float64))
    for (i, k), v in zip(where, white.tolist(), strict=True):
        out[i][k] = v
    return out


def step_token_rewards(step_rewards: Sequence[float], starts: Sequence[int], mask: Sequence[int],
                       width: int) -> Tensor:
    """[width]: each turn's step reward on its last model token (PPO's and REINFORCE++'s per-token rewards)."""
    out = torch.zeros(width, dtype=torch.float32)
    for r, (_, end) in zip(step_rewards, turn_spans(starts, len(mask)), strict=True):
        # The turn's last model token (a turn that generated none, which engines do not return: the one before).
        model = [j for j in range(min(end, width)) if mask[j]]
        if model:
            out[model[-1]] += float(r)
    return out
