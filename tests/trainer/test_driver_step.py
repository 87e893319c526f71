"""The driver's step around fake rollout and learner: who numbers the weights, and what a step hands over."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlscale.progress import TargetTracker
from rlscale.spec import load_rlrun
from rlscale.trainer.batching import RolloutBatch
from rlscale.trainer.driver import Driver, RunState
from rlscale.trainer.rewards import resolve_reward
from rlscale.trainer.tasks import Problem
from tests.conftest import EXAMPLES


class FakeRollout:
    def __init__(self, reply: str):
        self.reply, self.published = reply, []

    def generate(self, prompt_ids, n, **_):
        sample = SimpleNamespace(token_ids=[ord(c) for c in self.reply], logprobs=[-1.0] * len(self.reply),
                                 finish_reason="stop")
        return [[sample] * n for _ in prompt_ids]

    def publish_weights(self, version, weights):
        self.published.append(version)

    def generation_seconds_total(self):
        return 0.0


class FakeLearner:
    def __init__(self):
        self.batches = []

    def step(self, batch, lr=None):
        self.batches.append(batch)
        # What the learner does with groups that all scored alike: no update.
        skipped = len(set(batch.rewards)) == 1
        return {"skipped": 1.0 if skipped else 0.0, "loss": None if skipped else 0.1}

    def export_weights(self):
        return {}


class CharTokenizer:
    def __call__(self, text):
        return SimpleNamespace(input_ids=[ord(c) for c in text])

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["".join(map(chr, s)) for s in ids]


def driver(reply: str) -> Driver:
    d = Driver.__new__(Driver)  # the loop's step only; no task files, no Ray, no DeepSpeed
    d.spec = load_rlrun(EXAMPLES / "quickstart.yaml").spec
    d.state = RunState(prompts=2, learning_rate=1e-4)
    d.plan = {"learnerReplicas": 1, "predicted": {"stepSeconds": 1.0}}
    d.rollout, d.learner, d.tok = FakeRollout(reply), FakeLearner(), CharTokenizer()
    d.reward_fn = resolve_reward("exact-match")
    d.data = SimpleNamespace(next_batch=lambda p: [Problem("1+1=", "2"), Problem("2+2=", "4")][:p])
    d.tracker = TargetTracker(0.8)
    d.checkpoint_seconds = None
    return d


def test_a_skipped_step_keeps_the_weights_version_and_publishes_nothing():
    d = driver("7")  # every sample wrong: every group scores alike, the learner skips
    rec = d.step()
    assert rec["skipped"] is True and rec["weights_version"] == 0 and d.rollout.published == []
    assert rec["step"] == 1 and rec["samples"] == 2 * d.spec.batch.samples_per_prompt


def test_an_applied_step_publishes_the_next_version():
    d = driver("2")  # right on the first prompt, wrong on the second: a signal
    rec = d.step()
    assert rec["skipped"] is False and rec["weights_version"] == 1 and d.rollout.published == [1]


def test_the_learner_gets_a_rollout_batch_with_the_samplers_logprobs():
    d = driver("2")
    d.step()
    (batch,) = d.learner.batches
    n = d.spec.batch.samples_per_prompt
    assert isinstance(batch, RolloutBatch) and batch.samples_per_prompt == n and len(batch) == 2 * n
    assert batch.rewards == pytest.approx([1.0] * n + [0.0] * n)
    assert batch.rollout_logprobs == [[-1.0]] * (2 * n)


def test_the_record_carries_the_learners_diagnostics():
    from rlscale.metrics_names import DIAGNOSTIC_KEYS

    d = driver("2")
    values = {"mixed_group_fraction": 0.5, "entropy": 1.25, "clip_fraction": 0.02, "grad_norm": 3.5,
              "logprob_diff": -1e-3, "logprob_abs_diff": 4e-3}
    step = d.learner.step
    d.learner.step = lambda batch, lr=None: {**step(batch, lr), **values}
    rec = d.step()
    assert {k: rec[k] for k in DIAGNOSTIC_KEYS} == values
    d.learner.step = step  # a learner that reports none of them: present, and None
    rec = d.step()
    assert all(k in rec and rec[k] is None for k in DIAGNOSTIC_KEYS)
