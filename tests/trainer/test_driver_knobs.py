"""The driver's loop around fakes with a TRL user's knobs: the rollout gets topK, minP and repetitionPenalty
when set (and only then), and a TRL-style reward is scored once a batch in its worker, logged as a term, and
ended with the run."""

from __future__ import annotations

import os
import sys

from rlscale.roles import RunEnd
from rlscale.trainer.rewards import resolve_reward
from tests.trainer.test_driver_step import FakeRollout, driver
from tests.trainer.test_reward_trl import TRL_REWARDS, calls


class Recording(FakeRollout):
    def __init__(self, reply: str):
        super().__init__(reply)
        self.calls: list[dict] = []

    def generate(self, prompt_ids, n, **kw):
        self.calls.append(kw)
        return super().generate(prompt_ids, n, **kw)


def test_the_rollout_gets_the_knobs_that_are_set(tmp_path):
    d = driver("2", tmp_path, rollout={"top_k": 20, "min_p": 0.05, "temperature": 0.9})
    d.rollout = Recording("2")
    d.step()
    (kw,) = d.rollout.calls
    assert (kw["temperature"], kw["top_p"], kw["top_k"], kw["min_p"]) == (0.9, 1.0, 20, 0.05)
    assert "repetition_penalty" not in kw  # unset: not sent, so a rollout that does not know it still works
    plain = driver("2", tmp_path / "plain")
    plain.rollout = Recording("2")
    plain.step()
    assert not {"top_k", "min_p", "repetition_penalty"} & set(plain.rollout.calls[0])


def test_a_trl_reward_in_the_run_is_one_call_a_batch_in_its_worker(tmp_path, monkeypatch):
    (tmp_path / "trl_rewards.py").write_text(TRL_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "trl_rewards", raising=False)
    monkeypatch.setenv("RLSCALE_PLUGINS", str(tmp_path))
    monkeypatch.setenv("TRL_REWARD_LOG", str(tmp_path / "calls.log"))
    d = driver("2", tmp_path, budget={"max_steps": 2}, batch={"samples_per_prompt": 2},
               task={"reward": "trl_rewards:reward_len + exact-match", "reward_workers": 1})
    d.task.reward = resolve_reward(d.spec.task.reward, timeout_s=d.spec.task.reward_timeout)
    assert d.run() == RunEnd.BUDGET
    # reward_len of "2": -|6 - 1| / 6 on every sample; exact-match: "2" is right for 1+1= only.
    for rec in d.records:
        assert rec.reward_terms["trl_rewards:reward_len"] == -5 / 6
        assert rec.reward_terms["exact-match"] == 0.5
    # Each step's 2 prompts x 2 samples in one call, in the worker process the first step started (the held-out
    # eval before it is scored in the driver's process, as every term's is).
    steps = [pid for name, n, pid in calls(tmp_path / "calls.log") if n == "4"]
    assert len(steps) == 2 and len(set(steps)) == 1 and steps[0] != str(os.getpid())
    assert d.task.reward.batch_pool is None  # closed at the run's end
