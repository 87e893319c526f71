"""What the algorithms do differently inside a learner step, behind one interface: which samples carry
an advantage, what is prepared before the update (PPO: the critic's values and GAE; REINFORCE++: the
returns, whitened over the whole batch), the policy loss per token (token ratios, or GSPO's sequence
ratio), where the reference KL goes (a loss term, or the per-token rewards), and what the reported
loss sums. The tensor math itself is rlscale.trainer.algorithms, .advantages and .losses."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from rlscale.spec.algorithm import ALGORITHMS, GROUP_ALGORITHMS
from rlscale.trainer import advantages as V
from rlscale.trainer import algorithms as A
from rlscale.trainer import losses as L
from rlscale.trainer.batching import MicroBatch, RolloutBatch
from rlscale.trainer.tools import credit as T

# (model, micro-batch) -> per-token log-probs of the response tokens
Logprobs = Callable[[Any, MicroBatch], torch.Tensor]
# micro-batch -> the critic's per-token values
Values = Callable[[MicroBatch], torch.Tensor]
# a float64 tensor -> its sum over the learner's ranks
AllSum = Callable[[torch.Tensor], torch.Tensor]



class Objective(Protocol):
    name: str
    uses_critic: bool  # a value model trained beside the policy
    kl_in_loss: bool  # the reference KL is a term of the policy loss (else it shapes the rewards)

    def advantages(self, batch: RolloutBatch, rewards: torch.Tensor | None = None,
                   in_loss: torch.Tensor | None = None) -> tuple[torch.Tensor, list[int]]:
        """Per-sample advantages from the training rewards (default: the batch's) and the prompt groups
        worth training on (zeros where they come later); `in_loss` marks the samples whose tokens enter
        the loss (default: all)."""
        ...

    def prepare(self, packed: Sequence[MicroBatch], logprobs: Logprobs, values: Values | None,
                policy: Any, reference: Any | None, all_sum: AllSum | None = None) -> None:
        """Before any update: whatever the loss needs that the advantages did not give."""
        ...

    def policy_loss(self, logprobs: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                    *, clip_low: float, clip_high: float | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-token policy loss [B, T] (before aggregation) and where its clipped side won."""
        ...

    def outside_clip(self, logprobs: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, *,
                     clip_low: float, clip_high: float | None) -> torch.Tensor:
        """Per token, 1.0 where the ratio to the sampling policy lies outside the clip range."""
        ...

    def total_loss(self, stats: dict[str, float]) -> float:
        """The loss reported for the step, from the reduced stats."""
        ...


class _TokenRatio:
    """The PPO clipped surrogate on each token's own ratio."""

    def policy_loss(self, logprobs, old, advantages, mask, *, clip_low, clip_high):
        return A.token_policy_loss(logprobs, old, advantages, clip_low=clip_low, clip_high=clip_high)

    def outside_clip(self, logprobs, behaviour, mask, *, clip_low, clip_high):
        return A.outside_clip(logprobs, behaviour, clip_low=clip_low, clip_high=clip_high)


@dataclass(frozen=True)
class GroupBaseline(_TokenRatio):
    """No critic; each sample's advantage compares its reward with its prompt group's; the reference
    KL is a loss term (DeepSeekMath). By name:

    grpo: A_i = (r_i - mean(group)) / (std(group) + eps), or r_i - mean(group) with std_normalize off
          (Dr. GRPO); token ratios.
    gspo: GRPO's advantages with GSPO's sequence-level ratio (rlscale.trainer.losses.gspo_policy_loss).
    rloo: A_i = r_i - 1/(k-1) sum_{j != i} r_j (leave-one-out baseline); token ratios.
    reinforce++-baseline: A_i = r_i - mean(group), whitened over every token of the trained batch.

    With per-turn credit (the batch has turn_starts: spec.task.turnCredit rewardToGo) the advantages are per
    token: each turn's return against the same turn index's in the group (rlscale.trainer.tools.credit).
    """

    name: str = "grpo"
    std_normalize: bool = True
    drop_uniform_groups: bool = True  # groups whose samples all score the same teach nothing
    kl_coef: float = 0.0
    turn_discount: float = 1.0  # spec.task.turnDiscount: a later turn's reward in an earlier turn's return
    uses_critic: bool = False
    kl_in_loss: bool = True

    def __post_init__(self):
        if self.name not in GROUP_ALGORITHMS:
            raise ValueError(f"GroupBaseline: {self.name!r} is not one of {', '.join(GROUP_ALGORITHMS)}")

    def advantages(self, batch: RolloutBatch, rewards: torch.Tensor | None = None,
                   in_loss: torch.Tensor | None = None) -> tuple[torch.Tensor, list[int]]:
        spp = batch.samples_per_prompt
        rewards = torch.tensor(batch.rewards, dtype=torch.float32) if rewards is None else rewards
        in_loss = torch.ones(len(batch), dtype=torch.bool) if in_loss is None else in_loss
        if batch.turn_starts is not None:
            return self._turn_advantages(batch, rewards, in_loss)
        if self.drop_uniform_groups:
            kept = A.groups_with_signal(rewards, spp)
        else:
            kept = torch.ones(len(batch), dtype=torch.bool)
        if self.name == "rloo":
            advantages = V.rloo_advantages(rewards, spp)
        elif self.name == "reinforce++-baseline":
            lengths = torch.tensor([batch.model_tokens(i) for i in range(len(batch))], dtype=torch.float64)
            advantages = V.reinforce_pp_baseline_advantages(rewards, spp, lengths * (kept & in_loss))
        else:
            advantages = A.grpo_advantages(rewards, spp, normalize_std=self.std_normalize)
        return advantages, kept[::spp].nonzero().flatten().tolist()

    def _turn_advantages(self, batch: RolloutBatch, rewards: torch.Tensor,
                         in_loss: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """Per token [N, longest response]: each turn's return baselined per group and turn index."""
        if self.name == "gspo":
            raise ValueError("spec.task.turnCredit: rewardToGo gives each turn its own advantage, but gspo has one "
                             "ratio per sequence; use algorithm.name grpo, or turnCredit: trajectory")
        spp = batch.samples_per_prompt
        returns = [T.turn_returns(total, steps, self.turn_discount)
                   for total, steps in zip(rewards.tolist(), batch.turn_rewards, strict=True)]
        how = {"rloo": "rloo", "reinforce++-baseline": "centred"}.get(
            self.name, "grpo" if self.std_normalize else "centred")
        per_turn, signal = T.group_turn_advantages(returns, spp, how)
        keep = signal if self.drop_uniform_groups else [True] * len(signal)
        if self.name == "reinforce++-baseline":
            weights = [float(keep[i // spp] and bool(in_loss[i])) for i in range(len(batch))]
            per_turn = T.whitened_turns(per_turn, batch.turn_starts, batch.response_mask, weights)
        lengths = [len(r) for r in batch.response_ids]
        return T.per_token(per_turn, batch.turn_starts, lengths), [g for g, k in enumerate(keep) if k]

    def prepare(self, packed, logprobs, values, policy, reference, all_sum=None) -> None:
        pass

    def policy_loss(self, logprobs, old, advantages, mask, *, clip_low, clip_high):
        if self.name == "gspo":
            return L.gspo_policy_loss(logprobs, old, advantages, mask, clip_low=clip_low, clip_high=clip_high)
        return super().policy_loss(logprobs, old, advantages, mask, clip_low=clip_low, clip_high=clip_high)

    def outside_clip(self, logprobs, behaviour, mask, *, clip_low, clip_high):
        if self.name == "gspo":
            return L.sequence_outside_clip(logprobs, behaviour, mask, clip_low=clip_low, clip_high=clip_high)
        return super().outside_clip(logprobs, behaviour, mask, clip_low=clip_low, clip_high=clip_high)

    def total_loss(self, stats: dict[str, float]) -> float:
        # kl_loss: the KL term as the loss aggregated it (equal to the token mean `kl` under token-mean).
        return stats["policy_loss"] + self.kl_coef * stats.get("kl_loss", stats["kl"])


# The pre-family name of GroupBaseline("grpo").
GRPO = GroupBaseline


class _PerTokenReturns(_TokenRatio):
    """Advantages come per token from returns in prepare(); per sample there are none yet, and
    every group is kept."""

    def advantages(self, batch: RolloutBatch, rewards: torch.Tensor | None = None,
                   in_loss: torch.Tensor | None = None) -> tuple[torch.Tensor, list[int]]:
        return torch.zeros(len(batch)), list(range(len(batch) // batch.samples_per_prompt))


@dataclass(frozen=True)
class PPO(_PerTokenReturns):
    """A critic and GAE over per-token rewards; the reference KL is a per-token reward penalty."""

    gamma: float = 1.0
    lam: float = 0.95
    kl_coef: float = 0.0
    name: str = "ppo"
    uses_critic: bool = True
    kl_in_loss: bool = False

    @torch.no_grad()
    def prepare(self, packed, logprobs, values, policy, reference, all_sum=None) -> None:
        """Old values, reference KL and GAE advantages before any update, whitened over this rank's share."""
        all_adv = []
        for mb in packed:
            mb.old_values = values(mb) * mb.mask
            kl = _reward_kl(mb, logprobs, policy, reference)
            rewards = _token_rewards(mb, kl, self.kl_coef)
            mb.advantages, mb.returns = A.gae(rewards, mb.old_values, mb.mask, gamma=self.gamma, lam=self.lam)
            all_adv.append((mb.advantages, mb.mask))
        white = A.whiten(torch.cat([a.flatten() for a, _ in all_adv]), torch.cat([m.flatten() for _, m in all_adv]))
        for mb, part in zip(packed, white.split([mb.advantages.numel() for mb in packed]), strict=True):
            mb.advantages = part.view_as(mb.advantages)

    def total_loss(self, stats: dict[str, float]) -> float:
        return stats["policy_loss"]


@dataclass(frozen=True)
class ReinforcePP(_PerTokenReturns):
    """REINFORCE++ (Hu et al. 2025): no critic; the reference KL is a per-token reward penalty (k1);
    per-token returns G_t = sum_{s >= t} gamma^(s-t) r_s, r_s = R [s last] - kl_coef * k1_s; advantages
    A_t = (G_t - mu) / sqrt(var + eps), mu and var over every token of the batch (all ranks)."""

    gamma: float = 1.0
    kl_coef: float = 0.0
    name: str = "reinforce++"
    uses_critic: bool = False
    kl_in_loss: bool = False

    @torch.no_grad()
    def prepare(self, packed, logprobs, values, policy, reference, all_sum=None) -> None:
        returns = []
        moments = torch.zeros(3, dtype=torch.float64)
        for mb in packed:
            kl = _reward_kl(mb, logprobs, policy, reference)
            rewards = _token_rewards(mb, kl, self.kl_coef)
            returns.append(V.reward_to_go(rewards, mb.mask, self.gamma))
            moments += V.token_moments(returns[-1], mb.mask).cpu()
        moments = all_sum(moments) if all_sum is not None else moments
        for mb, ret in zip(packed, returns, strict=True):
            mb.advantages = V.whiten_by(ret, mb.mask, moments)

    def total_loss(self, stats: dict[str, float]) -> float:
        return stats["policy_loss"]


def _token_rewards(mb: MicroBatch, kl: torch.Tensor | None, kl_coef: float) -> torch.Tensor:
    """The per-token rewards: the training reward on the last model token, less kl_coef x KL; with per-turn
    credit each turn's environment reward on its own last model token and the rest of the reward on the last."""
    if mb.step_rewards is None:
        return A.token_rewards(mb.rewards, mb.mask, kl=kl, kl_coef=kl_coef)
    steps = mb.step_rewards * mb.mask
    return A.token_rewards(mb.rewards - steps.sum(dim=1), mb.mask, kl=kl, kl_coef=kl_coef) + steps


def _reward_kl(mb: MicroBatch, logprobs: Logprobs, policy: Any, reference: Any | None) -> torch.Tensor | None:
    """The reward penalty's per-token KL, k1 (its sum over a sequence is the sequence's log ratio); the
    reported KL (mb.kl) is k3, which is never negative. None without a reference model."""
    if reference is None:
        return None
    lp, ref = logprobs(policy, mb), logprobs(reference, mb)
    mb.kl = A.kl_divergence(lp, ref, "k3") * mb.mask
    return A.kl_divergence(lp, ref, "k1")


def objective_for(config: Any) -> GroupBaseline | PPO | ReinforcePP:
    """The objective a LearnerConfig names; an error naming the field for any other."""
    name = config.algorithm
    if name in GROUP_ALGORITHMS:
        return GroupBaseline(name=name, std_normalize=config.std_normalize,
                             drop_uniform_groups=config.drop_uniform_groups, kl_coef=config.kl_coef,
                             turn_discount=config.turn_discount)
    if name == "ppo":
        return PPO(gamma=config.gamma, lam=config.lam, kl_coef=config.kl_coef)
    if name == "reinforce++":
        return ReinforcePP(gamma=config.gamma, kl_coef=config.kl_coef)
    raise ValueError(f"spec.algorithm.name: {name!r} is not supported; use one of {', '.join(ALGORITHMS)}")
