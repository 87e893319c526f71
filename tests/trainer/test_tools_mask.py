"""Multi-turn learning: tool and observation tokens carry no gradient. With a real (tiny) Qwen2 model and the
learner's own pieces (pack, response_logprobs, the objectives' policy losses, aggregate, the KL and entropy
terms), the loss and every parameter's gradient stay the same when whatever the loss computes at observation
positions changes: the observation tokens as prediction targets, their old, sampler and reference log-probs.
Without the mask the same change moves the loss (so the comparison can fail)."""

from __future__ import annotations

import copy

import pytest
import torch

from rlscale.trainer import algorithms as A
from rlscale.trainer import losses as L
from rlscale.trainer.advantages import reward_to_go
from rlscale.trainer.batching import RolloutBatch, pack
from rlscale.trainer.logprobs import response_logprobs
from rlscale.trainer.objectives import GroupBaseline

# response: 3 model tokens (a tool call), 4 observation tokens, 2 model tokens (the answer, EOS)
MASK = [1, 1, 1, 0, 0, 0, 0, 1, 1]
OBS = [i for i, m in enumerate(MASK) if not m]


@pytest.fixture(scope="module")
def model():
    from transformers import Qwen2ForCausalLM

    from rlscale.trainer.modeling import qwen2_config

    torch.manual_seed(0)
    return Qwen2ForCausalLM(qwen2_config(hidden_size=64, num_layers=1, num_heads=1, head_dim=64,
                                         intermediate_size=128)).float()


def _batch(masked: bool) -> RolloutBatch:
    g = torch.Generator().manual_seed(1)
    responses = [torch.randint(4, 17, (len(MASK),), generator=g).tolist() for _ in range(4)]
    lps = [(-torch.rand(len(MASK), generator=g)).tolist() for _ in range(4)]
    return RolloutBatch(prompt_ids=[[1, 5, 6, 7]] * 4, response_ids=responses, rewards=[1.0, 0.0, 0.0, 1.0],
                        samples_per_prompt=4, rollout_logprobs=lps,
                        response_mask=[list(MASK) for _ in range(4)] if masked else None)


def _loss_and_grads(model, mb, mode: str, algorithm: str):
    model.zero_grad()
    logp, entropy = response_logprobs(model, mb, chunk=8, entropy_grad=True)
    objective = GroupBaseline(name=algorithm)
    per_token, _ = objective.policy_loss(logp, mb.old_logprobs, mb.advantages, mb.mask, clip_low=0.2, clip_high=0.28)
    weight, _ = L.truncated_is_weight(mb.old_logprobs, mb.rollout_logprobs, 2.0)
    agg = lambda x: L.aggregate(x, mb.mask, mode, max_length=len(MASK))  # noqa: E731
    kl = A.kl_divergence(logp, mb.ref_logprobs, "k3")
    loss = agg(per_token * weight) + 0.1 * agg(kl) - 0.01 * agg(entropy)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _perturbed(mb):
    """The same micro-batch with everything at the observation positions changed, the context kept."""
    out = copy.copy(mb)
    g = torch.Generator().manual_seed(7)
    out.response = mb.response.clone()
    out.response[:, OBS] = torch.randint(4, 17, (mb.response.shape[0], len(OBS)), generator=g)
    for name in ("old_logprobs", "rollout_logprobs", "ref_logprobs"):
        t = getattr(mb, name).clone()
        t[:, OBS] = -3 * torch.rand(t.shape[0], len(OBS), generator=g)
        setattr(out, name, t)
    return out


def _prepared(batch: RolloutBatch, algorithm: str):
    adv, _ = GroupBaseline(name=algorithm).advantages(batch)
    mb = pack(batch, list(range(len(batch))), adv, "cpu")
    mb.old_logprobs = mb.rollout_logprobs + 0.05
    mb.ref_logprobs = mb.rollout_logprobs - 0.1
    return mb


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("algorithm", ["grpo", "gspo"])
def test_observation_tokens_carry_no_loss_and_no_gradient(model, mode, algorithm):
    mb = _prepared(_batch(masked=True), algorithm)
    assert mb.mask[:, OBS].abs().sum() == 0 and mb.mask.sum() == 4 * sum(MASK)
    loss, grads = _loss_and_grads(model, mb, mode, algorithm)
    loss2, grads2 = _loss_and_grads(model, _perturbed(mb), mode, algorithm)
    assert loss2 == pytest.approx(loss, rel=1e-5, abs=1e-7)
    assert any(g.abs().sum() > 0 for g in grads.values())
    for name, g in grads.items():
        torch.testing.assert_close(grads2[name], g, rtol=1e-5, atol=1e-7, msg=name)


def test_without_the_mask_the_same_change_moves_the_loss(model):
    mb = _prepared(_batch(masked=False), "grpo")
    loss, _ = _loss_and_grads(model, mb, "token-mean", "grpo")
    loss2, _ = _loss_and_grads(model, _perturbed(mb), "token-mean", "grpo")
    assert abs(loss2 - loss) > 1e-4


def test_per_token_returns_pass_through_observations_as_if_they_were_not_there():
    """PPO's GAE and REINFORCE++'s returns on a masked response equal those on the model's tokens alone."""
    torch.manual_seed(3)
    mask = torch.tensor([MASK + [0, 0]], dtype=torch.float32)  # then two padding positions
    kept = mask[0].nonzero().flatten()
    values = torch.randn(1, mask.shape[1])
    rewards = A.token_rewards(torch.tensor([1.0]), mask) - 0.05 * torch.rand(1, mask.shape[1]) * mask
    assert rewards[0, kept[-1]] > 0.9 and rewards[0, len(MASK):].abs().sum() == 0  # the reward on the last model token
    adv, ret = A.gae(rewards, values, mask, gamma=0.99, lam=0.9)
    adv_c, ret_c = A.gae(rewards[:, kept], values[:, kept], torch.ones(1, len(kept)), gamma=0.99, lam=0.9)
    torch.testing.assert_close(adv[:, kept], adv_c)
    torch.testing.assert_close(ret[:, kept], ret_c)
    assert adv[0, OBS].abs().sum() == 0 and ret[0, OBS].abs().sum() == 0
    g = reward_to_go(rewards, mask, gamma=0.9)
    torch.testing.assert_close(g[:, kept], reward_to_go(rewards[:, kept], torch.ones(1, len(kept)), gamma=0.9))


def test_token_counts_are_the_models_tokens():
    b = _batch(masked=True)
    assert [b.model_tokens(i) for i in range(len(b))] == [sum(MASK)] * 4
    assert RolloutBatch.from_dict({**b.__dict__}).response_mask == b.response_mask
    with pytest.raises(ValueError, match="response_mask"):
        RolloutBatch(prompt_ids=[[1]], response_ids=[[2, 3]], rewards=[0.0], samples_per_prompt=1,
                     response_mask=[[1]])
