"""Per-turn credit (spec.task.turnCredit rewardToGo, rlscale.trainer.tools.credit): the returns per turn, their
baselines per prompt group and turn index, the per-token advantages the learner packs, PPO's and REINFORCE++'s
per-token rewards, and the turns as the loop records them, a checkpoint keeps them and the driver hands them
over. Every expected number is worked out by hand in the comments."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from rlscale.trainer import algorithms as A
from rlscale.trainer.advantages import reward_to_go
from rlscale.trainer.batching import RolloutBatch, pack
from rlscale.trainer.objectives import GroupBaseline, _token_rewards
from rlscale.trainer.tools import credit as T

EPS = 1e-6


def test_returns_from_each_turn_on():
    # total 1.5 = steps 0.5 - 0.2 + 0.2, plus 1.0 from the task's reward on the last turn.
    assert T.turn_returns(1.5, [0.5, -0.2, 0.2]) == pytest.approx([1.5, 1.0, 1.2])
    # discount 0.5: G2 = 0.2 + 1.0 = 1.2, G1 = -0.2 + 0.5 * 1.2 = 0.4, G0 = 0.5 + 0.5 * 0.4 = 0.7
    assert T.turn_returns(1.5, [0.5, -0.2, 0.2], 0.5) == pytest.approx([0.7, 0.4, 1.2])
    assert T.turn_returns(1.0, [0.0]) == pytest.approx([1.0]) and T.turn_returns(0.0, []) == []


def test_baselines_per_group_and_turn_index():
    # One group of three: returns [1.5, 1.0], [0.5] (one turn), [1.0, 0.0].
    returns = [[1.5, 1.0], [0.5], [1.0, 0.0]]
    adv, signal = T.group_turn_advantages(returns, 3, "grpo", EPS)
    # turn 0: mean 1.0, centred 0.5, -0.5, 0, unbiased std 0.5 -> 1, -1, 0
    # turn 1: samples 0 and 2 only: mean 0.5, centred +-0.5, std sqrt(0.5) -> +-1/sqrt(2)
    assert adv[0] == pytest.approx([1.0, 1 / math.sqrt(2)], abs=1e-5)
    assert adv[1] == pytest.approx([-1.0], abs=1e-5)
    assert adv[2] == pytest.approx([0.0, -1 / math.sqrt(2)], abs=1e-5)
    assert signal == [True]
    rloo, _ = T.group_turn_advantages(returns, 3, "rloo")  # n/(n-1) x centred: 1.5 x on turn 0, 2 x on turn 1
    assert rloo == [pytest.approx([0.75, 1.0]), pytest.approx([-0.75]), pytest.approx([0.0, -1.0])]
    centred, _ = T.group_turn_advantages(returns, 3, "centred")
    assert centred == [pytest.approx([0.5, 0.5]), pytest.approx([-0.5]), pytest.approx([0.0, -0.5])]


def test_a_turn_reached_by_one_sample_or_equal_returns_teach_nothing():
    adv, signal = T.group_turn_advantages([[1.0, 2.0], [1.0], [0.0], [0.0]], 2, "grpo")
    assert adv == [[0.0, 0.0], [0.0], [0.0], [0.0]] and signal == [False, False]
    # Equal trajectory returns, different turn returns: turn 1 teaches, so the group is kept.
    returns = [T.turn_returns(1.0, [1.0, 0.0]), T.turn_returns(1.0, [0.0, 1.0])]  # [1, 0] and [1, 1]
    adv, signal = T.group_turn_advantages(returns, 2, "centred")
    assert signal == [True] and adv == [pytest.approx([0.0, -0.5]), pytest.approx([0.0, 0.5])]


def test_the_first_turn_gets_grpo_advantage_of_the_trajectory():
    g = torch.Generator().manual_seed(0)
    steps = [torch.rand(k, generator=g).tolist() for k in (1, 3, 2, 2, 1, 3)]
    totals = [sum(s) + float(torch.rand(1, generator=g)) for s in steps]
    adv, _ = T.group_turn_advantages([T.turn_returns(t, s) for t, s in zip(totals, steps, strict=True)], 3, "grpo")
    expected = A.grpo_advantages(torch.tensor(totals), 3).tolist()
    assert [a[0] for a in adv] == pytest.approx(expected, rel=1e-4, abs=1e-5)


def test_spans_tokens_and_step_rewards():
    # a response: observation (2 tokens), turn 0 (3 model + 2 observation), turn 1 (2 model)
    mask = [0, 0, 1, 1, 1, 0, 0, 1, 1]
    starts = [2, 7]
    assert T.turn_spans(starts, len(mask)) == [(2, 7), (7, 9)]
    tokens = T.per_token([[0.5, -1.0]], [starts], [len(mask)])
    assert tokens[0].tolist() == [0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5, -1.0, -1.0]
    steps = T.step_token_rewards([0.3, 0.7], starts, mask, 11)  # padded to 11
    assert steps.tolist() == pytest.approx([0, 0, 0, 0, 0.3, 0, 0, 0, 0.7, 0, 0])


def test_reinforce_pp_baseline_whitens_turns_by_their_model_tokens():
    # sample 0: turns of 2 and 1 model tokens, values 1 and -1; sample 1: one turn of 1 token, value 0.
    out = T.whitened_turns([[1.0, -1.0], [0.0]], [[0, 3], [0]], [[1, 1, 0, 1], [1]], [1.0, 1.0])
    # tokens 1, 1, -1, 0: mean 0.25, variance (3 x 0.5625 + 1.5625) / 4 = 0.6875
    sd = math.sqrt(0.6875)
    assert out == [pytest.approx([0.75 / sd, -1.25 / sd], rel=1e-5), pytest.approx([-0.25 / sd], rel=1e-5)]
    dropped = T.whitened_turns([[1.0, -1.0], [0.0]], [[0, 3], [0]], [[1, 1, 0, 1], [1]], [1.0, 0.0])
    assert dropped[1] == [0.0]


def turn_batch(step_rewards, totals, *, turns=True) -> RolloutBatch:
    """Two-turn trajectories of one prompt: turn 0 = 3 model tokens, 2 observation tokens; turn 1 = 2 model."""
    n = len(totals)
    return RolloutBatch(prompt_ids=[[1, 2]] * n, response_ids=[[5, 6, 7, 8, 9, 10, 11]] * n, rewards=list(totals),
                        samples_per_prompt=n, response_mask=[[1, 1, 1, 0, 0, 1, 1]] * n,
                        turn_starts=[[0, 5]] * n if turns else None,
                        turn_rewards=[list(s) for s in step_rewards] if turns else None)


def test_turn_tokens_get_their_own_advantage_and_the_same_under_trajectory():
    # Both score 1 in all; sample 0 earned it at turn 0, sample 1 at turn 1 (the task's reward is 0).
    steps, totals = [[1.0, 0.0], [0.0, 1.0]], [1.0, 1.0]
    objective = GroupBaseline(name="grpo", std_normalize=False)
    adv, kept = objective.advantages(turn_batch(steps, totals))
    # turn 0 returns 1 and 1 (equal: 0); turn 1 returns 0 and 1 (centred -0.5, +0.5)
    assert kept == [0] and adv.shape == (2, 7)
    mb = pack(turn_batch(steps, totals), [0, 1], adv, "cpu")
    model = mb.mask > 0
    assert mb.advantages[0][model[0]].tolist() == pytest.approx([0.0, 0.0, 0.0, -0.5, -0.5])
    assert mb.advantages[1][model[1]].tolist() == pytest.approx([0.0, 0.0, 0.0, 0.5, 0.5])
    # Different per-turn rewards with different totals under grpo: turn 0's tokens differ from turn 1's.
    steps, totals = [[0.5, 0.0], [-0.5, 0.0]], [1.5, 0.5]  # + the task's 1.0 and 1.0
    adv, _ = GroupBaseline(name="grpo").advantages(turn_batch(steps, totals))
    assert adv[0, 0].item() == pytest.approx(1 / math.sqrt(2), abs=1e-5) and adv[0, 5].item() == 0.0
    # trajectory: the batch carries no turns, so one advantage per sample on every token
    flat, kept = GroupBaseline(name="grpo").advantages(turn_batch(steps, totals, turns=False))
    mb = pack(turn_batch(steps, totals, turns=False), [0, 1], flat, "cpu")
    assert flat.dim() == 1 and kept == [0] and mb.advantages[0].item() == pytest.approx(1 / math.sqrt(2), abs=1e-5)


def test_per_token_advantages_survive_packing_into_micro_batches():
    steps, totals = [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.0, 0.0]], [1.0, 1.0, 1.0, 0.0]
    batch = turn_batch(steps, totals)
    batch = replace(batch, response_ids=[r[:6] if i == 3 else r for i, r in enumerate(batch.response_ids)],
                    response_mask=[m[:6] if i == 3 else m for i, m in enumerate(batch.response_mask)])
    adv, _ = GroupBaseline(name="rloo").advantages(batch)
    whole = pack(batch, [0, 1, 2, 3], adv, "cpu")
    for part in ([3], [2, 0], [1]):  # any split: each sample keeps its tokens' advantages
        mb = pack(batch, part, adv, "cpu")
        for b, i in enumerate(part):
            width = len(batch.response_ids[i])
            assert mb.advantages[b, :width].tolist() == whole.advantages[i, :width].tolist()


def test_gspo_refuses_per_turn_advantages():
    with pytest.raises(ValueError, match="spec.task.turnCredit"):
        GroupBaseline(name="gspo").advantages(turn_batch([[1.0, 0.0], [0.0, 0.0]], [1.0, 0.0]))


def test_ppo_and_reinforce_pp_get_each_turns_reward_on_its_last_model_token():
    steps, totals = [[0.25, 0.5]], [1.75]  # the task's 1.0 at the end
    batch = turn_batch(steps, totals)
    mb = pack(batch, [0], torch.zeros(1), "cpu")
    rewards = _token_rewards(mb, None, 0.0)
    assert rewards[0].tolist() == pytest.approx([0, 0, 0.25, 0, 0, 0, 1.5])  # turn 0's last token; 0.5 + 1.0 last
    # reward-to-go (gamma 1): turn 0's tokens 1.75, turn 1's 1.5 (0 on the observation)
    assert reward_to_go(rewards, mb.mask)[0].tolist() == pytest.approx([1.75] * 3 + [0, 0] + [1.5] * 2)
    flat = pack(turn_batch(steps, totals, turns=False), [0], torch.zeros(1), "cpu")
    assert reward_to_go(_token_rewards(flat, None, 0.0), flat.mask)[0].tolist() == pytest.approx(
        [1.75] * 3 + [0, 0] + [1.75] * 2)


def test_the_batch_checks_and_carries_its_turns():
    b = turn_batch([[1.0, 0.0]], [1.0])
    assert RolloutBatch.from_dict(dict(b.__dict__)).turn_starts == [[0, 5]]
    with pytest.raises(ValueError, match="turn_starts"):
        replace(b, turn_starts=[[0, 9]])  # past the response
    with pytest.raises(ValueError, match="together"):
        replace(b, turn_rewards=None)


class StepEnv:
    """A plug-in environment with a reward every turn: 0.1 x a wrong guess's length in characters, 1 and done
    for the row's answer."""

    def reset(self, row):
        self.answer = row["answer"]
        return "go:"

    def step(self, action):
        if action.strip() == self.answer:
            return "", 1.0, True
        return "no", 0.1 * len(action.strip()), False


def test_the_loop_records_turns_a_checkpoint_keeps_them_and_the_driver_hands_them_over(tmp_path):
    from rlscale.plan import make_plan
    from rlscale.spec import load_rlrun
    from rlscale.trainer.driver import Driver, Task
    from rlscale.trainer.pipeline import Rollouts
    from rlscale.trainer.plan_source import FixedPlan
    from rlscale.trainer.rewards import resolve_reward
    from rlscale.trainer.sinks import RunLog
    from rlscale.trainer.tasks import Problem
    from rlscale.trainer.tools.loop import MultiTurnRollout, turn_credit_fields
    from rlscale.trainer.tools.task import build_tokenizer
    from tests.conftest import EXAMPLES
    from tests.trainer.test_driver_step import FakeLearner, Recorder
    from tests.trainer.test_tools_loop import ScriptedPolicy

    tok = build_tokenizer()
    policy = ScriptedPolicy(tok, lambda text: "7" if "no" in text else "12")  # 12 (wrong: 0.2), then 7 (right: 1)
    p = Problem("7?", "7", prompt_ids=tuple(tok("7?").input_ids))
    r = MultiTurnRollout(policy, tok, max_turns=3, max_tokens=64,
                         max_length=96, environment=StepEnv, rows={p.prompt_ids: {"answer": "7"}})
    (g,) = r.generate([list(p.prompt_ids)], 2, temperature=1.0, top_p=1.0, max_new_tokens=8)
    def count(text):
        return len(tok(text, add_special_tokens=False).input_ids)

    obs, guess = count("go:"), count("12") + 1  # with its EOS
    t = g[0]
    assert t.turn_starts == [obs, obs + guess + count("no")]
    assert t.turn_rewards == pytest.approx([0.2, 1.0]) and t.env_reward == pytest.approx(1.2)
    back = Rollouts.from_state(Rollouts(1, 0, [p], [list(p.prompt_ids)], g, ["7", "7"], [True, True], [1.2, 1.2],
                                        g).to_state())
    assert turn_credit_fields(back.samples) == turn_credit_fields(g)

    spec = load_rlrun(EXAMPLES / "quickstart.yaml").spec.model_copy(deep=True)
    spec.task.max_new_tokens, spec.task.turn_credit = 8, "rewardToGo"
    learner = FakeLearner()
    r = MultiTurnRollout(ScriptedPolicy(tok, lambda text: "7" if "no" in text else "12"), tok, max_turns=3,
                         max_tokens=64, max_length=96, environment=StepEnv,
                         rows={p.prompt_ids: {"answer": "7"}})
    run_log = RunLog(tmp_path / "run", spec.target.value, spec.target.metric, "t", report=False)
    d = Driver(spec=spec, plan=replace(make_plan(spec), prompts=1), task=Task([p], [p], resolve_reward("exact-match"),
               8), tokenizer=tok, learner=learner, rollout=r, run_log=run_log, sinks=[run_log, Recorder()],
               plan_source=FixedPlan(), ckpt_dir=tmp_path / "ckpt", run_id="ns/t")
    d.step()
    batch = learner.batches[0]
    n = spec.batch.samples_per_prompt
    assert batch.turn_rewards == [pytest.approx([0.2, 1.0])] * n
    assert batch.rewards == pytest.approx([2.2] * n)  # exact-match's 1 + the steps' 1.2
    assert batch.turn_starts == [t.turn_starts] * n
