"""GRPO and PPO behind the learner's one objective interface, checked against hand-computed values."""

from types import SimpleNamespace

import pytest
import torch

from rlscale.trainer.batching import RolloutBatch, pack
from rlscale.trainer.objectives import GRPO, PPO, objective_for


def batch(rewards: list[float], spp: int = 2) -> RolloutBatch:
    n = len(rewards)
    return RolloutBatch(prompt_ids=[[1, 2]] * n, response_ids=[[3, 4]] * n, rewards=rewards, samples_per_prompt=spp)


def test_grpo_trains_only_groups_with_mixed_rewards_and_centres_them():
    adv, kept = GRPO().advantages(batch([1.0, 0.0, 1.0, 1.0, 0.0, 0.0]))
    assert kept == [0]  # groups 1 and 2 scored alike: nothing to learn
    # (1 - 0.5) / (std [1, 0] = 0.7071 + 1e-6), and its negative
    assert adv[:2].tolist() == pytest.approx([0.7071, -0.7071], abs=1e-3) and adv[2:].tolist() == [0.0] * 4
    _, kept = GRPO(drop_uniform_groups=False).advantages(batch([1.0, 0.0, 1.0, 1.0]))
    assert kept == [0, 1]


def test_the_reported_loss_adds_the_kl_term_for_grpo_only():
    stats = {"policy_loss": 0.5, "kl": 0.2}
    assert GRPO(kl_coef=0.1).total_loss(stats) == pytest.approx(0.52)
    assert PPO(kl_coef=0.1).total_loss(stats) == 0.5  # PPO's KL shaped the rewards instead
    assert GRPO().kl_in_loss and not PPO().kl_in_loss and PPO().uses_critic and not GRPO().uses_critic


def test_ppo_prepares_gae_from_the_critic_and_whitens_it():
    b = batch([1.0, 0.0])
    adv, kept = PPO().advantages(b)
    assert adv.tolist() == [0.0, 0.0] and kept == [0]
    mb = pack(b, [0, 1], adv, "cpu")
    PPO(gamma=1.0, lam=1.0).prepare([mb], logprobs=None, values=lambda m: torch.zeros_like(m.mask), policy=None,
                                    reference=None)
    # Zero values, gamma = lam = 1: each token's advantage is the sequence reward (1, 1 and 0, 0),
    # whitened to mean 0 and unit variance over the four tokens: +1, +1, -1, -1.
    assert mb.returns.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert mb.advantages.flatten().tolist() == pytest.approx([1.0, 1.0, -1.0, -1.0], abs=1e-4)


def test_an_unknown_algorithm_is_refused_naming_the_field():
    cfg = SimpleNamespace(algorithm="reinforce", std_normalize=True, drop_uniform_groups=True, kl_coef=0.0)
    with pytest.raises(ValueError, match="spec.algorithm.name: 'reinforce' is not supported"):
        objective_for(cfg)
