"""The algorithm family (rloo, reinforce++, reinforce++-baseline, gspo, the loss aggregations, DAPO's
overlong penalty and filter) against examples computed by hand: each expected number below is
worked out in the comment beside it, never by calling the code under test."""

from __future__ import annotations

import math

import pytest
import torch

from rlscale.spec import parse_spec
from rlscale.trainer import advantages as V
from rlscale.trainer import losses as L
from rlscale.trainer.batching import RolloutBatch, pack
from rlscale.trainer.learner_config import LearnerConfig
from rlscale.trainer.objectives import PPO, GroupBaseline, ReinforcePP, objective_for


def batch(rewards: list[float], lengths: list[int], spp: int = 2, truncated=None) -> RolloutBatch:
    return RolloutBatch(prompt_ids=[[1, 2]] * len(rewards), response_ids=[[3] * n for n in lengths],
                        rewards=rewards, samples_per_prompt=spp, truncated=truncated)


def flat(t: torch.Tensor) -> list[float]:
    return t.flatten().tolist()


# --------------------------------------------------------------------------- RLOO


def test_rloo_leave_one_out_baseline_by_hand():
    # Group [1, 0, 0] (k = 3): A_0 = 1 - (0 + 0)/2 = 1; A_1 = 0 - (1 + 0)/2 = -0.5; A_2 = -0.5.
    # Group [0.5, 0.5, 0.5]: each baseline is 0.5, so 0.
    adv = V.rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.5, 0.5, 0.5]), 3)
    assert adv.tolist() == pytest.approx([1.0, -0.5, -0.5, 0.0, 0.0, 0.0])
    # Group [1, 0, 0, 1] (k = 4): A_0 = 1 - (0 + 0 + 1)/3 = 2/3, A_1 = 0 - (1 + 0 + 1)/3 = -2/3.
    assert V.rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4).tolist() == pytest.approx(
        [2 / 3, -2 / 3, -2 / 3, 2 / 3])
    with pytest.raises(ValueError, match="samples_per_prompt >= 2"):
        V.rloo_advantages(torch.tensor([1.0]), 1)


# --------------------------------------------------------------------------- REINFORCE++


def test_reinforce_pp_baseline_group_mean_then_token_weighted_whitening_by_hand():
    # Groups [1, 0] and [0, 0], lengths 2, 1, 3, 2. Centred: 0.5, -0.5, 0, 0. Over the batch's 8 tokens:
    # mu = (2*0.5 - 1*0.5)/8 = 0.0625; var = (2*0.4375^2 + 0.5625^2 + 5*0.0625^2)/8 = 0.08984375.
    sd = math.sqrt(0.08984375)
    adv = V.reinforce_pp_baseline_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 2, torch.tensor([2, 1, 3, 2]),
                                             eps=0.0)
    assert adv.tolist() == pytest.approx([0.4375 / sd, -0.5625 / sd, -0.0625 / sd, -0.0625 / sd], rel=1e-6)


def test_reinforce_pp_baseline_objective_whitens_over_the_trained_groups_only():
    # The uniform group [0, 0] is dropped, so the whitening sees group [1, 0] with lengths 2 and 1:
    # centred 0.5, -0.5 over 3 tokens: mu = (1 - 0.5)/3 = 1/6, var = (2*(1/3)^2 + (2/3)^2)/3 = 2/9,
    # so A = (1/3)/sqrt(2/9) = 1/sqrt(2) and (-2/3)/sqrt(2/9) = -sqrt(2); the dropped samples get 0.
    adv, kept = GroupBaseline(name="reinforce++-baseline").advantages(batch([1.0, 0.0, 0.0, 0.0], [2, 1, 3, 2]))
    assert kept == [0]
    assert adv.tolist() == pytest.approx([1 / math.sqrt(2), -math.sqrt(2), 0.0, 0.0], rel=1e-6)


def test_reinforce_pp_returns_whitened_over_the_whole_batch_by_hand():
    # Rewards 1 (1 token) and 0 (3 tokens), no KL, gamma 1: every token's return is its sequence's
    # reward, so the 4 tokens hold 1, 0, 0, 0: mu = 0.25, var = (0.75^2 + 3*0.25^2)/4 = 0.1875,
    # A = 0.75/sqrt(0.1875) = sqrt(3) and -0.25/sqrt(0.1875) = -1/sqrt(3). The two samples sit in
    # different micro-batches: the moments are summed before whitening.
    b = batch([1.0, 0.0], [1, 3])
    obj = ReinforcePP()
    adv, kept = obj.advantages(b)
    assert kept == [0] and adv.tolist() == [0.0, 0.0]
    parts = [pack(b, [0], adv, "cpu"), pack(b, [1], adv, "cpu")]
    obj.prepare(parts, logprobs=None, values=None, policy=None, reference=None, all_sum=lambda t: t)
    assert flat(parts[0].advantages) == pytest.approx([math.sqrt(3)], rel=1e-5)
    assert flat(parts[1].advantages) == pytest.approx([-1 / math.sqrt(3)] * 3, rel=1e-5)


def test_reward_to_go_is_discounted_and_stops_at_padding():
    # Reward 1 on the last real token of 3, gamma 0.5: returns 0.25, 0.5, 1, and 0 on padding.
    r = torch.tensor([[0.0, 0.0, 1.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert V.reward_to_go(r, mask, 0.5).tolist() == [[0.25, 0.5, 1.0, 0.0]]


def test_token_moments_of_parts_add_up_to_the_whole():
    x = torch.tensor([[1.0, 2.0], [3.0, 10.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    whole = V.token_moments(x, mask)
    assert whole.tolist() == [6.0, 14.0, 3.0]  # 1+2+3, 1+4+9, three tokens
    assert (V.token_moments(x[:1], mask[:1]) + V.token_moments(x[1:], mask[1:])).tolist() == whole.tolist()
    # mean 2, var 14/3 - 4 = 2/3: (1 - 2)/sqrt(2/3) = -sqrt(1.5), 0, +sqrt(1.5); padding stays 0
    assert flat(V.whiten_by(x, mask, whole, eps=0.0)) == pytest.approx([-math.sqrt(1.5), 0.0, math.sqrt(1.5), 0.0])


# --------------------------------------------------------------------------- aggregation modes


def test_the_three_aggregations_by_hand():
    loss = torch.tensor([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0]])  # the 9s sit on padding
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert L.aggregate(loss, mask, "token-mean").item() == pytest.approx(7 / 3)  # (1 + 2 + 4) / 3 tokens
    assert L.aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(2.75)  # (1.5 + 4) / 2
    # Dr. GRPO: token sum over responses x L_max = 7 / (2 x 4)
    assert L.aggregate(loss, mask, "seq-mean-token-sum-norm", max_length=4).item() == pytest.approx(0.875)
    # As one part of a larger batch (6 tokens, 4 sequences): 7/6, 5.5/4, 7/16.
    assert L.aggregate(loss, mask, "token-mean", tokens=6).item() == pytest.approx(7 / 6)
    assert L.aggregate(loss, mask, "seq-mean-token-mean", sequences=4).item() == pytest.approx(1.375)
    assert L.aggregate(loss, mask, "seq-mean-token-sum-norm", sequences=4, max_length=4).item() == pytest.approx(
        7 / 16)
    with pytest.raises(ValueError, match="spec.algorithm.lossAggregation: 'seq-sum'"):
        L.aggregate(loss, mask, "seq-sum")
    with pytest.raises(ValueError, match="max_length"):
        L.aggregate(loss, mask, "seq-mean-token-sum-norm")


def test_parts_aggregated_with_the_batch_totals_add_up_to_the_batch():
    torch.manual_seed(0)
    loss = torch.randn(4, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]).float()
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        whole = L.aggregate(loss, mask, mode, max_length=5)
        parts = sum(L.aggregate(loss[i:i + 2], mask[i:i + 2], mode, tokens=11, sequences=4, max_length=5)
                    for i in (0, 2))
        assert parts.item() == pytest.approx(whole.item(), rel=1e-6), mode


# --------------------------------------------------------------------------- GSPO


def test_gspo_sequence_ratio_clip_and_gradient_by_hand():
    # Sequence 1: token log ratios 0.1 and 0.3, mean 0.2: s = e^0.2 = 1.2214 > 1.2, A = +1, so the
    # clipped side wins: max(-1.2214, -1.2) = -1.2 (no gradient). Sequence 2: one token, log ratio
    # -0.1: s = e^-0.1 = 0.904837 inside [0.8, 1.2], A = -2: L = 2 x 0.904837 = 1.809675.
    old = torch.zeros(2, 2)
    logp = torch.tensor([[0.1, 0.3], [-0.1, 5.0]], requires_grad=True)  # 5.0 sits on padding
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    per_token, clipped = L.gspo_policy_loss(logp, old, torch.tensor([1.0, -2.0]), mask, clip_low=0.2)
    s2 = math.exp(-0.1)
    assert flat(per_token) == pytest.approx([-1.2, -1.2, 2 * s2, 2 * s2], rel=1e-6)
    assert clipped.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    loss = L.aggregate(per_token, mask, "seq-mean-token-mean")
    assert loss.item() == pytest.approx((-1.2 + 2 * s2) / 2, rel=1e-6)  # GSPO's 1/S sum_i L_i
    loss.backward()
    # d/dlogp_{2,0} of (1/2)(-A s) = (1/2)(2 s / |y|) = s2; the clipped sequence and the padding get 0.
    assert flat(logp.grad) == pytest.approx([0.0, 0.0, s2, 0.0], rel=1e-6)
    # token-mean weighs sequence 1 by its 2 tokens: (2 x -1.2 + 1.809675) / 3
    assert L.aggregate(per_token, mask, "token-mean").item() == pytest.approx((-2.4 + 2 * s2) / 3, rel=1e-6)


def test_gspo_on_policy_gradient_is_the_length_normalised_policy_gradient():
    # At ratio 1 the GSPO gradient of sequence i is -A_i / |y_i| on each of its tokens (then / S).
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    per_token, _ = L.gspo_policy_loss(logp, logp.detach(), torch.tensor([3.0, -1.0]), mask)
    L.aggregate(per_token, mask, "seq-mean-token-mean").backward()
    assert flat(logp.grad) == pytest.approx([-0.5, -0.5, -0.5, 0.5, 0.0, 0.0])  # -3/3/2, +1/1/2


def test_gspo_clip_fraction_counts_tokens_of_sequences_outside_the_range():
    behaviour = torch.zeros(2, 2)
    logp = torch.tensor([[0.1, 0.3], [0.0, 0.1]])  # sequence ratios e^0.2 = 1.22 (outside) and e^0.05 (inside)
    mask = torch.ones(2, 2)
    assert L.sequence_outside_clip(logp, behaviour, mask, clip_low=0.2).tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert L.sequence_outside_clip(logp, behaviour, mask, clip_low=0.2, clip_high=0.28).tolist() == [[0.0, 0.0],
                                                                                                      [0.0, 0.0]]


# --------------------------------------------------------------------------- DAPO: overlong


def test_soft_overlong_penalty_by_hand():
    # L_max 8, L_cache 3: free up to 5 tokens, then (5 - |y|)/3: 6 -> -1/3, 7 -> -2/3, 8 -> -1.
    lengths = torch.tensor([4, 5, 6, 7, 8, 9])
    assert V.overlong_penalty(lengths, 8, 3).tolist() == pytest.approx([0, 0, -1 / 3, -2 / 3, -1, -1])
    assert V.overlong_penalty(lengths, 8, 3, factor=0.5).tolist() == pytest.approx([0, 0, -1 / 6, -1 / 3, -0.5, -0.5])
    shaped = V.training_rewards(torch.tensor([1.0, 1.0]), torch.tensor([5, 7]), max_length=8, buffer=3)
    assert shaped.tolist() == pytest.approx([1.0, 1 / 3])
    assert V.training_rewards(torch.tensor([1.0]), torch.tensor([8])).tolist() == [1.0]  # no buffer: unchanged


def test_pack_leaves_filtered_samples_out_of_the_loss():
    b = batch([1.0, 0.0, 1.0, 0.0], [2, 3, 1, 2], truncated=[False, True, False, False])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    mb = pack(b, [0, 1], adv, "cpu", rewards=torch.tensor([0.5, 0.0, 0.5, 0.0]),
              in_loss=torch.tensor([True, False, True, True]))
    assert mb.mask.tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]] and mb.num_samples == 1
    assert mb.advantages.tolist() == [1.0, 0.0] and mb.rewards.tolist() == [0.5, 0.0]
    assert RolloutBatch.from_dict({"prompt_ids": [[1]], "response_ids": [[2]], "rewards": [0.0],
                                   "samples_per_prompt": 1, "truncated": [1]}).truncated == [True]


# --------------------------------------------------------------------------- objectives


def test_each_name_builds_its_objective():
    def config(name):
        return LearnerConfig(model_path="/m", algorithm=name, std_normalize=False, drop_uniform_groups=False)

    assert isinstance(objective_for(config("ppo")), PPO)
    assert isinstance(objective_for(config("reinforce++")), ReinforcePP)
    for name in ("grpo", "gspo", "rloo", "reinforce++-baseline"):
        obj = objective_for(config(name))
        assert isinstance(obj, GroupBaseline) and obj.name == name and obj.kl_in_loss and not obj.uses_critic
        assert not obj.std_normalize and not obj.drop_uniform_groups
    assert not ReinforcePP().kl_in_loss and not ReinforcePP().uses_critic


def test_group_objectives_advantages_by_hand():
    b = batch([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], [1, 1, 1, 1, 1, 1], spp=3)
    # rloo, group [1, 0, 0]: 1, -0.5, -0.5; group [1, 1, 1] is uniform and dropped.
    adv, kept = GroupBaseline(name="rloo").advantages(b)
    assert kept == [0] and adv[:3].tolist() == pytest.approx([1.0, -0.5, -0.5])
    # gspo shares GRPO's advantages: mean 1/3, unbiased std sqrt(1/3): (2/3)/0.57735 = 1.1547.
    adv, _ = GroupBaseline(name="gspo").advantages(b)
    assert adv[:3].tolist() == pytest.approx([2 / 3 / math.sqrt(1 / 3), -1 / 3 / math.sqrt(1 / 3),
                                              -1 / 3 / math.sqrt(1 / 3)], rel=1e-5)


def test_the_training_rewards_decide_which_groups_are_mixed():
    # Both samples score 1, but the overlong penalty makes them 1 and 1/3: a mixed group.
    b = batch([1.0, 1.0], [5, 7])
    shaped = V.training_rewards(torch.tensor(b.rewards), torch.tensor([5, 7]), max_length=8, buffer=3)
    _, kept = GroupBaseline().advantages(b, shaped)
    assert kept == [0]
    assert GroupBaseline().advantages(b)[1] == []


def test_the_reported_loss_uses_the_aggregated_kl_term():
    assert GroupBaseline(kl_coef=0.5).total_loss({"policy_loss": 1.0, "kl": 0.2, "kl_loss": 0.4}) == pytest.approx(1.2)
    assert ReinforcePP(kl_coef=0.5).total_loss({"policy_loss": 1.0, "kl": 0.2}) == 1.0  # its KL shaped the rewards


def test_learner_config_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="spec.algorithm.lossAggregation: 'mean'"):
        LearnerConfig(model_path="/m", loss_aggregation="mean")
    with pytest.raises(ValueError, match="spec.algorithm.klEstimator: 'k4'"):
        LearnerConfig(model_path="/m", kl_estimator="k4")
    with pytest.raises(ValueError, match="max_response_length"):
        LearnerConfig(model_path="/m", loss_aggregation="seq-mean-token-sum-norm")


def test_the_algorithm_knobs_reach_the_learner_config():
    s = parse_spec({"hardware": {"accelerator": "cpu"}, "task": {"maxNewTokens": 16},
                    "algorithm": {"name": "gspo", "klCoef": 0.01, "klEstimator": "k1", "entropyCoef": 0.01,
                                  "stdNormalize": False, "dropUniformGroups": False, "maskTruncatedCompletions": True,
                                  "overlongBuffer": {"length": 4, "penaltyFactor": 0.5}}})
    c = LearnerConfig.from_spec(s, "/m")
    assert (c.algorithm, c.kl_coef, c.kl_estimator, c.entropy_coef, c.loss_aggregation) == \
        ("gspo", 0.01, "k1", 0.01, "seq-mean-token-mean")
    assert (c.std_normalize, c.drop_uniform_groups, c.mask_truncated, c.overlong_buffer,
            c.overlong_penalty_factor, c.max_response_length) == (False, False, True, 4, 0.5, 16)
    ppo = LearnerConfig.from_spec(parse_spec({"hardware": {"accelerator": "cpu"},
                                              "algorithm": {"name": "ppo", "valueClip": 0}}), "/m")
    assert ppo.value_clip is None and ppo.loss_aggregation == "token-mean"
