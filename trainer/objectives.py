"""What GRPO and PPO do differently inside a learner step, behind one interface: which samples carry
an advantage, what is prepared before the update (PPO: the critic's values and GAE), where the
reference KL goes (GRPO: a loss term; PPO: the per-token rewards), and what the reported loss sums.
The tensor math itself is rlscale.trainer.algorithms."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from rlscale.trainer import algorithms as A
from rlscale.trainer.batching import MicroBatch, RolloutBatch

# (model, micro-batch) -> per-token log-probs of the response tokens
Logprobs = Callable[[Any, MicroBatch], torch.Tensor]
# micro-batch -> the critic's per-token values
Values = Callable[[MicroBatch], torch.Tensor]


class Objective(Protocol):
    name: str
    uses_critic: bool  # a value model trained beside the policy
    kl_in_loss: bool  # the reference KL is a term of the policy loss (else it shapes the rewards)

    def advantages(self, batch: RolloutBatch) -> tuple[torch.Tensor, list[int]]:
        """Per-sample advantages (zeros where they come later) and the prompt groups worth training on."""
        ...

    def prepare(self, packed: Sequence[MicroBatch], logprobs: Logprobs, values: Values | None,
                policy: Any, reference: Any | None) -> None:
        """Before any update: whatever the loss needs that the advantages did not give."""
        ...

    def total_loss(self, stats: dict[str, float]) -> float:
        """The loss reported for the step, from its per-token means."""
        ...


@dataclass(frozen=True)
class GRPO:
    """Group-normalised advantages, no critic; the reference KL is a loss term (DeepSeekMath)."""

    std_normalize: bool = True
    drop_uniform_groups: bool = True  # groups whose samples all score the same teach nothing
    kl_coef: float = 0.0
    name: str = "grpo"
    uses_critic: bool = False
    kl_in_loss: bool = True

    def advantages(self, batch: RolloutBatch) -> tuple[torch.Tensor, list[int]]:
        groups = len(batch) // batch.samples_per_prompt
        rewards = torch.tensor(batch.rewards, dtype=torch.float32)
        advantages = A.grpo_advantages(rewards, batch.samples_per_prompt, normalize_std=self.std_normalize)
        if not self.drop_uniform_groups:
            return advantages, list(range(groups))
        keep = A.groups_with_signal(rewards, batch.samples_per_prompt)[:: batch.samples_per_prompt]
        return advantages, keep.nonzero().flatten().tolist()

    def prepare(self, packed, logprobs, values, policy, reference) -> None:
        pass

    def total_loss(self, stats: dict[str, float]) -> float:
        return stats["policy_loss"] + self.kl_coef * stats["kl"]


@dataclass(frozen=True)
class PPO:
    """A critic and GAE over per-token rewards; the reference KL is a per-token reward penalty."""

    gamma: float = 1.0
    lam: float = 0.95
    kl_coef: float = 0.0
    name: str = "ppo"
    uses_critic: bool = True
    kl_in_loss: bool = False

    def advantages(self, batch: RolloutBatch) -> tuple[torch.Tensor, list[int]]:
        return torch.zeros(len(batch)), list(range(len(batch) // batch.samples_per_prompt))

    @torch.no_grad()
    def prepare(self, packed, logprobs, values, policy, reference) -> None:
        """Old values, reference KL and GAE advantages before any update, whitened over this rank's share."""
        all_adv = []
        for mb in packed:
            mb.old_values = values(mb) * mb.mask
            kl = None
            if reference is not None:
                lp, ref = logprobs(policy, mb), logprobs(reference, mb)
                # The reward penalty uses k1 (its sum over a sequence is the sequence's log
                # ratio); the reported KL uses k3, which is never negative.
                kl = A.kl_divergence(lp, ref, "k1")
                mb.kl = A.kl_divergence(lp, ref, "k3") * mb.mask
            rewards = A.token_rewards(mb.rewards, mb.mask, kl=kl, kl_coef=self.kl_coef)
            mb.advantages, mb.returns = A.gae(rewards, mb.old_values, mb.mask, gamma=self.gamma, lam=self.lam)
            all_adv.append((mb.advantages, mb.mask))
        white = A.whiten(torch.cat([a.flatten() for a, _ in all_adv]), torch.cat([m.flatten() for _, m in all_adv]))
        for mb, part in zip(packed, white.split([mb.advantages.numel() for mb in packed]), strict=True):
            mb.advantages = part.view_as(mb.advantages)

    def total_loss(self, stats: dict[str, float]) -> float:
        return stats["policy_loss"]


def objective_for(config: Any) -> GRPO | PPO:
    """The objective a LearnerConfig names; an error naming the field for any other."""
    if config.algorithm == "grpo":
        return GRPO(std_normalize=config.std_normalize, drop_uniform_groups=config.drop_uniform_groups,
                    kl_coef=config.kl_coef)
    if config.algorithm == "ppo":
        return PPO(gamma=config.gamma, lam=config.lam, kl_coef=config.kl_coef)
    raise ValueError(f"spec.algorithm.name: {config.algorithm!r} is not supported; use 'grpo' or 'ppo'")
