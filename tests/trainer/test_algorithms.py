"""The pure algorithm functions against hand-computed values and edge cases."""

import math

import pytest
import torch

from rlscale.trainer import algorithms as A


def test_masked_mean_ignores_padding_and_accepts_batch_denominator():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]]).float()
    assert A.masked_mean(x, mask).item() == pytest.approx(2.0)  # (1+2+3)/3
    assert A.masked_mean(x, mask, dim=1).tolist() == pytest.approx([1.5, 3.0])
    assert A.masked_mean(x, mask, denom=6).item() == pytest.approx(1.0)
    # An all-padding row divides by 1, not 0.
    assert A.masked_mean(x, torch.zeros_like(mask)).item() == 0.0


def test_grpo_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv = A.grpo_advantages(rewards, group_size=4, eps=0.0)
    # Group 1: mean 0.25, unbiased std sqrt(0.75/3) = 0.5.
    assert adv[:4].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])
    # Group 2: all equal -> zero advantage, not NaN.
    assert adv[4:].tolist() == [0.0, 0.0, 0.0, 0.0]
    plain = A.grpo_advantages(rewards, group_size=4, normalize_std=False)
    assert plain[:4].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_grpo_advantages_reject_partial_groups():
    with pytest.raises(ValueError, match="groups of 4"):
        A.grpo_advantages(torch.zeros(6), group_size=4)


def test_groups_with_signal():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    assert A.groups_with_signal(rewards, 2).tolist() == [True, True, False, False, False, False]


def test_gae_by_hand():
    # One sequence of 3 tokens, reward 1 at the end, gamma 0.9, lambda 0.5.
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 9.0]])  # 9.0 sits on padding and must be ignored
    mask = torch.tensor([[1, 1, 1, 0]]).float()
    adv, ret = A.gae(rewards, values, mask, gamma=0.9, lam=0.5)
    d2 = 1.0 - 0.7
    d1 = 0.0 + 0.9 * 0.7 - 0.6
    d0 = 0.0 + 0.9 * 0.6 - 0.5
    a2 = d2
    a1 = d1 + 0.45 * a2
    a0 = d0 + 0.45 * a1
    assert adv[0].tolist() == pytest.approx([a0, a1, a2, 0.0])
    assert ret[0].tolist() == pytest.approx([a0 + 0.5, a1 + 0.6, a2 + 0.7, 0.0])


def test_gae_with_gamma_lambda_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[0.0, 0.0, 2.0]])
    values = torch.tensor([[0.1, 0.2, 0.3]])
    mask = torch.ones(1, 3)
    adv, ret = A.gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert adv[0].tolist() == pytest.approx([1.9, 1.8, 1.7])
    assert ret[0].tolist() == pytest.approx([2.0, 2.0, 2.0])


def test_token_rewards_places_reward_on_last_real_token():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]]).float()
    r = A.token_rewards(torch.tensor([1.0, 2.0, 5.0]), mask)
    assert r.tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 2.0], [0.0, 0.0, 0.0]]
    kl = torch.full((3, 3), 0.5)
    r = A.token_rewards(torch.tensor([1.0, 2.0, 5.0]), mask, kl=kl, kl_coef=0.1)
    assert r[0].tolist() == pytest.approx([-0.05, 0.95, 0.0])


def test_policy_loss_on_policy_is_minus_advantage_and_gradient_is_policy_gradient():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    adv = torch.tensor([2.0])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, stats = A.policy_loss(logp, logp.detach(), adv, mask)
    assert loss.item() == pytest.approx(-2.0)
    loss.backward()
    # d/dlogp of -A * exp(logp - old) at ratio 1 is -A / n_tokens on real tokens.
    assert logp.grad[0].tolist() == pytest.approx([-1.0, -1.0, 0.0])
    assert stats["clipfrac"].item() == 0.0


def test_policy_loss_clips_by_hand_and_asymmetrically():
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.5, 0.5]]))  # ratios 1.5 and 0.5
    mask = torch.ones(1, 2)
    pos = torch.tensor([1.0])
    loss, stats = A.policy_loss(logp, old, pos, mask, clip_low=0.2)
    # A>0: token 1 clipped to 1.2 -> -1.2; token 2 min(0.5, 0.8) -> max(-0.5,-0.8) = -0.5.
    assert loss.item() == pytest.approx((-1.2 - 0.5) / 2)
    assert stats["clipfrac"].item() == pytest.approx(0.5)
    loss, _ = A.policy_loss(logp, old, pos, mask, clip_low=0.2, clip_high=0.28)
    assert loss.item() == pytest.approx((-1.28 - 0.5) / 2)
    neg = torch.tensor([-1.0])
    loss, _ = A.policy_loss(logp, old, neg, mask, clip_low=0.2, clip_high=0.28)
    # A<0: token 1 max(1.5, 1.28) -> 1.5; token 2 max(0.5, 0.8) -> 0.8.
    assert loss.item() == pytest.approx((1.5 + 0.8) / 2)


def test_policy_loss_token_level_mean_over_batch_denominator():
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, 0.0])
    loss, _ = A.policy_loss(logp, logp, adv, mask)
    assert loss.item() == pytest.approx(-0.25)  # token level: 1 of 4 tokens has A=1
    loss, _ = A.policy_loss(logp, logp, adv, mask, denom=8)
    assert loss.item() == pytest.approx(-1 / 8)


def test_value_loss_clipped_by_hand():
    values = torch.tensor([[1.0, 0.0]])
    old = torch.tensor([[0.0, 0.0]])
    returns = torch.tensor([[2.0, 1.0]])
    mask = torch.ones(1, 2)
    # Token 1: unclipped (1-2)^2 = 1, clipped V=0.2 -> (0.2-2)^2 = 3.24 -> 3.24; token 2: 1.
    assert A.value_loss(values, old, returns, mask, clip=0.2).item() == pytest.approx(0.5 * (3.24 + 1) / 2)
    assert A.value_loss(values, old, returns, mask, clip=None).item() == pytest.approx(0.5 * (1 + 1) / 2)


def test_kl_estimators():
    logp = torch.tensor([math.log(0.5), math.log(0.2)])
    ref = torch.tensor([math.log(0.25), math.log(0.2)])
    k1 = A.kl_divergence(logp, ref, "k1")
    k2 = A.kl_divergence(logp, ref, "k2")
    k3 = A.kl_divergence(logp, ref, "k3")
    assert k1.tolist() == pytest.approx([math.log(2), 0.0])
    assert k2.tolist() == pytest.approx([0.5 * math.log(2) ** 2, 0.0])  # x^2 / 2, x = log 2
    assert k3.tolist() == pytest.approx([0.5 - 1 + math.log(2), 0.0])
    assert (k3 >= 0).all()
    with pytest.raises(ValueError, match="k4.*k1, k2, k3"):
        A.kl_divergence(logp, ref, "k4")


def test_kl_k3_is_unbiased_for_true_kl():
    torch.manual_seed(0)
    p = torch.tensor([0.7, 0.2, 0.1])
    q = torch.tensor([0.4, 0.4, 0.2])
    true_kl = (p * (p / q).log()).sum().item()
    x = torch.multinomial(p, 200_000, replacement=True)
    k3 = A.kl_divergence(p.log()[x], q.log()[x], "k3").mean().item()
    # One seed, but no tuned margin: k3's standard deviation here is 0.0806, so the mean of
    # 200,000 draws has a standard error of 0.00018 and abs=0.01 is 55 of them (computed as
    # sqrt(sum p (k3 - KL)^2 / 200000) in float64).
    assert k3 == pytest.approx(true_kl, abs=0.01)


def test_entropy_and_logprobs():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]])
    ent = A.entropy_from_logits(logits)
    assert ent.tolist() == pytest.approx([math.log(4), 0.0], abs=1e-6)
    lp = A.token_logprobs(logits, torch.tensor([2, 0]))
    assert lp.tolist() == pytest.approx([-math.log(4), 0.0], abs=1e-6)


def test_whiten():
    x = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    w = A.whiten(x, mask)
    assert w[0, :2].tolist() == pytest.approx([-1.0, 1.0], abs=1e-4)
    assert w[0, 2].item() == 0.0


def test_outside_clip_by_hand_and_asymmetrically():
    behaviour = torch.zeros(1, 5)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0, 1.25, 0.81]]))  # ratios to the sampler
    assert A.outside_clip(logp, behaviour, clip_low=0.2).tolist() == [[1.0, 1.0, 0.0, 1.0, 0.0]]
    # DAPO's wider upper side keeps 1.25 inside.
    assert A.outside_clip(logp, behaviour, clip_low=0.2, clip_high=0.28).tolist() == [[1.0, 1.0, 0.0, 0.0, 0.0]]
    assert not A.outside_clip(logp, behaviour).requires_grad


def test_mixed_group_fraction_counts_groups_not_samples():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.5])  # mixed, uniform, uniform(0) ...
    assert A.mixed_group_fraction(rewards[:6], 3) == pytest.approx(0.5)
    assert A.mixed_group_fraction(rewards, 3) == pytest.approx(2 / 3)
    assert A.mixed_group_fraction(torch.ones(8), 4) == 0.0
