"""DAPO's dynamic sampling in the driver's step, around a fake rollout and learner: the trained batch
holds only groups with mixed rewards, N of them when the rounds allow, and every generated sample
counts in the run's samples, its tokens and the generate phase."""

from __future__ import annotations

import json
from copy import deepcopy
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlscale.plan import make_plan
from rlscale.spec import DynamicSamplingSpec, load_rlrun
from rlscale.trainer.driver import Driver, Task
from rlscale.trainer.dynamic_sampling import mixed_groups, next_round_prompts
from rlscale.trainer.plan_source import FixedPlan
from rlscale.trainer.rewards import resolve_reward
from rlscale.trainer.sinks import RunLog
from rlscale.trainer.tasks import Problem
from tests.conftest import EXAMPLES
from tests.trainer.one_replica import OneReplica

SPP = 2


class ScriptedRollout(OneReplica):
    """Prompts in `mixed` get one right and one wrong answer (a mixed group), every other prompt two
    wrong ones (a uniform group); a reply longer than `limit` characters is cut there (finish "length")."""

    def __init__(self, answers: dict[str, str], mixed: set[str], limit: int = 4):
        self.answers, self.mixed, self.limit = answers, mixed, limit
        self.calls: list[int] = []  # prompts per generate call

    def generate(self, prompt_ids, n, **_):
        self.calls.append(len(prompt_ids))
        out = []
        for ids in prompt_ids:
            prompt = "".join(map(chr, ids))
            replies = [self.answers[prompt] if prompt in self.mixed and j == 0 else "x" for j in range(n)]
            out.append([self._sample(r) for r in replies])
        return out

    def _sample(self, reply: str):
        ids = [ord(c) for c in reply][: self.limit]
        return SimpleNamespace(token_ids=ids, logprobs=[-1.0] * len(ids),
                               finish_reason="length" if len(reply) > self.limit else "stop")


class Learner:
    """Skips when no group has mixed rewards, as the real learner does."""

    def __init__(self):
        self.batches = []

    def step(self, batch, lr=None):
        self.batches.append(batch)
        groups = [batch.rewards[i:i + SPP] for i in range(0, len(batch), SPP)]
        skipped = not any(len(set(g)) > 1 for g in groups)
        return {"skipped": 1.0 if skipped else 0.0, "loss": None if skipped else 0.1}

    def export_weights(self):
        return {}

    def save_checkpoint(self, directory, state=None, keep=2):
        pass

    def load_checkpoint(self, directory):
        return None


class CharTokenizer:
    def __call__(self, text):
        return SimpleNamespace(input_ids=[ord(c) for c in text])

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["".join(map(chr, s)) for s in ids]


PROBLEMS = [Problem(f"{a}+1=", str(a + 1)) for a in range(10)]


def driver(tmp_path: Path, mixed: set[str], max_rounds: int = 4, prompts: int = 2, enabled: bool = True,
           limit: int = 4) -> Driver:
    spec = load_rlrun(EXAMPLES / "quickstart.yaml").spec.model_copy(deep=True)
    spec.batch = spec.batch.model_copy(update={"samples_per_prompt": SPP})
    spec.algorithm = spec.algorithm.model_copy(update={
        "dynamic_sampling": DynamicSamplingSpec(enabled=enabled, max_rounds=max_rounds)})
    plan = replace(make_plan(spec), prompts=prompts)
    run_log = RunLog(tmp_path / "run", spec.target.value, spec.target.metric, "t")
    rollout = ScriptedRollout({p.prompt: p.answer for p in PROBLEMS}, mixed, limit)
    return Driver(spec=spec, plan=plan, task=Task(PROBLEMS, PROBLEMS, resolve_reward("exact-match"), 4),
                  tokenizer=CharTokenizer(), learner=Learner(), rollout=rollout, run_log=run_log, sinks=[run_log],
                  plan_source=FixedPlan(), ckpt_dir=tmp_path / "ckpt", run_id="ns/t")


def groups_of(batch) -> list[list[float]]:
    return [batch.rewards[i:i + SPP] for i in range(0, len(batch), SPP)]


def upcoming(d: Driver, n: int) -> list[str]:
    """The next n prompts the driver will draw (a copy of its seeded iterator)."""
    return [p.prompt for p in deepcopy(d.data).next_batch(n)]


def test_the_trained_batch_holds_only_mixed_groups_and_every_generated_sample_counts(tmp_path):
    d = driver(tmp_path, mixed=set(), prompts=2)
    first, second, third = upcoming(d, 2), upcoming(d, 4)[2:], upcoming(d, 6)[4:]
    # Round 1: of its 2 prompts only the first is mixed. 1 group missing, 1 of 2 seen mixed: round 2
    # draws min(2, ceil(1 / 0.5)) = 2 prompts, both mixed; the first of them completes the batch.
    d.rollout.mixed = {first[0], *second, *third}
    rec = d.step()
    (batch,) = d.learner.batches
    assert d.rollout.calls == [2, 2]
    assert ["".join(map(chr, ids)) for ids in batch.prompt_ids[::SPP]] == [first[0], second[0]]
    assert all(len(set(g)) > 1 for g in groups_of(batch)) and len(groups_of(batch)) == 2
    # Every generated sample counts: 4 prompts x 2 samples, of which 4 were trained.
    assert rec.samples == d.state.samples == rec.batch_samples == 8 and len(batch) == 4
    trained = sum(len(r) for r in batch.response_ids)
    assert rec.generated_tokens > trained and rec.skipped is False
    assert d.refill.last == {"rounds": 2, "groups": 4, "mixed": 2}
    assert rec.phases["generate"] >= 0 and rec.phases["reward"] >= 0


def test_rounds_stop_at_the_bound_and_a_batch_without_signal_is_skipped(tmp_path):
    d = driver(tmp_path, mixed=set(), max_rounds=3, prompts=2)
    rec = d.step()
    # No mixed group ever: 3 rounds of a whole batch (2 prompts) each; the learner gets the first round.
    assert d.rollout.calls == [2, 2, 2]
    assert rec.samples == 3 * 2 * SPP and rec.skipped is True
    assert len(d.learner.batches[0]) == 2 * SPP and d.refill.last == {"rounds": 3, "groups": 6, "mixed": 0}


def test_fewer_mixed_groups_than_wanted_train_on_what_was_found(tmp_path):
    d = driver(tmp_path, mixed=set(), max_rounds=2, prompts=4)
    d.rollout.mixed = {upcoming(d, 4)[1]}  # one mixed group in round 1, none after
    rec = d.step()
    (batch,) = d.learner.batches
    # 3 missing, 1 of 4 seen mixed: round 2 draws min(4, ceil(3 x 4)) = 4; past maxRounds the step
    # trains on the one mixed group it found.
    assert d.rollout.calls == [4, 4] and len(groups_of(batch)) == 1 and len(set(batch.rewards)) == 2
    assert rec.samples == 8 * SPP and rec.skipped is False


def test_off_it_generates_once(tmp_path):
    d = driver(tmp_path, mixed=set(), enabled=False, prompts=2)
    assert d.refill is None
    rec = d.step()
    assert d.rollout.calls == [2] and rec.samples == 2 * SPP


def test_the_rollout_batch_carries_the_truncated_flags(tmp_path):
    # Replies cut at 1 character: the 2-character answers ("10" for 9+1=) come back truncated.
    d = driver(tmp_path, mixed={p.prompt for p in PROBLEMS}, enabled=False, limit=1, prompts=10)
    d.step()
    (batch,) = d.learner.batches
    prompts = ["".join(map(chr, ids)) for ids in batch.prompt_ids[::SPP]]
    assert batch.truncated == [p == "9+1=" and j == 0 for p in prompts for j in range(SPP)]


def test_mixed_is_judged_on_the_training_rewards():
    # Two right answers of 1 and 4 tokens: equal task rewards, but with L_max 4 and L_cache 2 the
    # 4-token one loses 1: a mixed group. Without the buffer it is uniform.
    assert mixed_groups([1.0, 1.0], [1, 4], 2, max_length=4, buffer=2, factor=1.0) == [0]
    assert mixed_groups([1.0, 1.0], [1, 4], 2, max_length=4, buffer=0, factor=1.0) == []


def test_with_per_turn_credit_equal_endings_whose_turns_differ_are_mixed():
    """Per-turn credit: two trajectories of equal training reward 1, one through a turn the environment
    rewarded 0.5 and one through turns it rewarded 0, return 0.5 and 1.0 from turn 1: that group teaches (the
    learner's per-turn advantages are not zero there), so dynamic sampling keeps it; judged on the
    trajectories' rewards alone it is uniform and would be dropped."""
    shape = dict(max_length=8, buffer=0, factor=1.0)
    assert mixed_groups([1.0, 1.0], [4, 4], 2, **shape) == []
    assert mixed_groups([1.0, 1.0], [4, 4], 2, **shape, turn_rewards=[[0.5, 0.0], [0.0, 0.0]]) == [0]
    # the same turns and totals: nothing to teach
    assert mixed_groups([1.0, 1.0], [4, 4], 2, **shape, turn_rewards=[[0.5, 0.0], [0.5, 0.0]]) == []
    # a turn index only one sample reached gives no baseline (as in the learner)
    assert mixed_groups([1.0, 1.0], [4, 4], 2, **shape, turn_rewards=[[0.0], [0.0, 0.0]]) == []


@pytest.mark.parametrize("wanted,have,seen,mixed,expected", [
    (8, 0, 8, 0, 8),     # nothing mixed yet: a whole batch
    (8, 4, 8, 4, 8),     # half mixed, 4 missing: 4 / 0.5 = 8
    (8, 6, 8, 6, 3),     # 3/4 mixed, 2 missing: ceil(2 / 0.75) = 3
    (8, 7, 16, 7, 3),    # 7 of 16 mixed, 1 missing: ceil(16/7) = 3
    (8, 2, 64, 2, 8),    # rarely mixed: capped at a whole batch
])
def test_next_round_size(wanted, have, seen, mixed, expected):
    assert next_round_prompts(wanted, have, seen, mixed) == expected


def test_the_run_log_keeps_the_honest_sample_count(tmp_path):
    d = driver(tmp_path, mixed={"1+1=", "2+1="}, prompts=2)
    d.run_log.start_fresh(d.plan)
    rec = d.step()
    d.finish_record(rec)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [x for x in lines if x.get("step") == 1]
    assert steps and steps[-1]["samples"] == sum(d.rollout.calls) * SPP
