"""Rewards in worker processes: a call stuck in C is killed at task.rewardTimeout and scores
task.rewardTimeoutScore (or stops the run), results stay in order, failures name the sample,
each term is logged on its own, and the pool ends with the run."""

from __future__ import annotations

import json
import textwrap
import time

import pytest

from rlscale.records import StepRecord
from rlscale.trainer.rewards import RewardError, RewardWorkerKilled, resolve_reward, score_terms

PLUGIN = textwrap.dedent("""
    import os, re

    def score(prompt, completion, answer, extra):
        if completion == "hang":  # catastrophic backtracking: stuck in C, no thread can interrupt it
            return 1.0 if re.match(r'(a+)+$', 'a' * 40 + 'b') else 0.0
        if completion == "boom":
            raise KeyError("level")
        if completion == "exit":
            os._exit(3)
        if completion == "oom":  # as the OOM killer ends a process that grew past its cgroup's limit
            os.kill(os.getpid(), 9)
        if completion == "text":
            return "yes"
        return float(len(completion)) + float(extra.get("bonus", 0)) + os.getpid() * 0.0
""")


@pytest.fixture(scope="module")
def reward(tmp_path_factory):
    """One pool (two workers) for the module: the plug-in found through RLSCALE_PLUGINS, as in a pod."""
    folder = tmp_path_factory.mktemp("plugins")
    (folder / "pool_plugin.py").write_text(PLUGIN)
    mp = pytest.MonkeyPatch()
    mp.setenv("RLSCALE_PLUGINS", str(folder))
    r = resolve_reward("2*pool_plugin:score + 0.5*exact-match", timeout_s=2.0)
    assert r.start_pool(workers=2, timeout_score=-1.0)
    yield r
    r.close()
    mp.undo()


def rows(completions, answers=None):
    n = len(completions)
    return (["p"] * n, completions, answers or ["2"] * n, [True] * n, [{} for _ in range(n)])


@pytest.mark.slow  # waits out a timeout or a killed worker by design (seconds): `make test`, not `make unit`
def test_a_call_stuck_in_c_is_killed_and_scores_the_timeout_score(reward):
    reward.timeout_score = -1.0
    pids = {w.proc.pid for w in reward.pool.workers}
    t0 = time.monotonic()
    got = score_terms(reward, *rows(["2", "hang", "abc", "22", "x"]))
    took = time.monotonic() - t0
    # In order: 2*len + 0.5*exact-match; the stuck call scores -1.0 and the others go on.
    assert got.rewards == [2.5, -1.0, 6.0, 4.0, 2.0]
    assert got.timeouts == 1 and reward.timeouts >= 1
    assert took < 2.0 + 10.0  # the timeout, not the regex's ~2**40 steps
    assert pids - {w.proc.pid for w in reward.pool.workers}, "the stuck worker was replaced"
    assert reward.pool.replaced >= 1 and all(w.proc.is_alive() for w in reward.pool.workers)
    # Each term's own mean, unweighted; the killed call has no value for the plug-in's term.
    assert got.term_means() == pytest.approx({"pool_plugin:score": (1 + 3 + 2 + 1) / 4, "exact-match": 1 / 5})
    # The pool goes on scoring, many rows in chunks, in order.
    many = [str(i) for i in range(200)]
    assert score_terms(reward, *rows(many, many)).rewards == [2 * len(c) + 0.5 for c in many]


@pytest.mark.slow  # waits out a timeout or a killed worker by design (seconds): `make test`, not `make unit`
def test_without_a_timeout_score_a_stuck_call_stops_the_run_naming_it(reward):
    reward.timeout_score = None
    try:
        with pytest.raises(RewardError, match=r"took more than 2 s \(task.rewardTimeout\) on prompt 'p' and "
                           r"completion 'hang'.*task.rewardTimeoutScore"):
            score_terms(reward, *rows(["1", "hang", "2"]))
    finally:
        reward.timeout_score = -1.0
    assert score_terms(reward, *rows(["1"])).rewards == [2.0]  # the pool is whole again


@pytest.mark.parametrize("completion, message", [
    ("boom", r"raised KeyError: 'level' for prompt 'p' and completion 'boom'"),
    ("text", r"returned 'yes' \(str\) for prompt 'p' and completion 'text'; it must return a float"),
    ("exit", r"worker process ended \(exit code 3\) on prompt 'p' and completion 'exit'"),
])
def test_failures_in_a_worker_stop_the_run_naming_the_sample(reward, completion, message):
    with pytest.raises(RewardError, match=message):
        score_terms(reward, *rows(["1", completion, "2", "3"]))
    assert score_terms(reward, *rows(["12"], ["3"])).rewards == [4.0]


@pytest.mark.slow  # waits out a timeout or a killed worker by design (seconds): `make test`, not `make unit`
def test_a_worker_killed_by_a_signal_is_a_fault_of_the_run_not_of_the_reward(reward):
    """The OOM killer's SIGKILL: not RewardError (which fails the run for good) but an error the run's
    restart path takes, so the run resumes from its checkpoint, as when the learner itself is killed."""
    with pytest.raises(RewardWorkerKilled, match=r"exit code -9\), killed by a signal .* completion 'oom'"):
        score_terms(reward, *rows(["1", "oom"]))
    assert not issubclass(RewardWorkerKilled, RewardError)
    assert score_terms(reward, *rows(["12"], ["3"])).rewards == [4.0]


def test_extra_and_the_close(tmp_path, monkeypatch):
    (tmp_path / "pool_plugin2.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))  # beside the spec: found through sys.path, as the driver found it
    r = resolve_reward("pool_plugin2:score", timeout_s=5.0)
    assert r.start_pool(workers=1)
    procs = [w.proc for w in r.pool.workers]
    assert score_terms(r, ["p"], ["ab"], [""], [True], [{"bonus": 3}]).rewards == [5.0]
    r.close()
    assert r.pool is None and not any(p.is_alive() for p in procs)


def test_builtin_rewards_on_fixed_patterns_start_no_pool():
    assert not resolve_reward("exact-match").start_pool(workers=2)
    assert not resolve_reward("0.9*exact-match + 0.1*format").start_pool(workers=2)
    custom = resolve_reward("format", format_pattern=r"(a+)+")  # the spec's pattern may backtrack for ever
    assert not custom.terms[0].safe
    got = score_terms(resolve_reward("0.9*exact-match + 0.1*format"), *rows(["2", "x", "3"]))
    assert got.rewards == pytest.approx([1.0, 0.0, 0.1])
    assert got.term_means() == pytest.approx({"exact-match": 1 / 3, "format": 2 / 3})


def test_the_step_record_and_metrics_carry_each_term(tmp_path):
    from rlscale.run_metrics import RunMetrics

    rec = StepRecord(step=3, reward_mean=0.5, reward_terms={"math": 0.25, "format": 1.0}, reward_timeouts=2,
                     phases={"generate": 1.5})
    again = StepRecord.from_dict(rec.to_dict())
    assert again.reward_terms == {"math": 0.25, "format": 1.0} and again.reward_timeouts == 2
    flat = rec.scalars()
    assert flat["reward/math"] == 0.25 and flat["reward/format"] == 1.0 and flat["reward/timeouts"] == 2
    assert flat["phases/generate"] == 1.5 and flat["reward_mean"] == 0.5 and "sample" not in flat
    m = RunMetrics()
    m.observe_step(rec)
    m.observe_step(rec)
    assert m.registry.get_sample_value("rlscale_reward_term_mean", {"term": "math"}) == 0.25
    assert m.registry.get_sample_value("rlscale_reward_timeouts_total") == 4


def test_the_report_has_a_line_per_term():
    from rlscale.report import summarize

    recs = [StepRecord(step=i, reward_terms={"math": i / 10, "format": 1.0}, reward_timeouts=i % 2)
            for i in range(1, 9)]
    text = summarize(recs, [], 0.9, "eval/accuracy", "t")
    assert "- reward term math: 0.150 over the first 2 steps, 0.750 over the last 2" in text
    assert "- reward term format: 1.000" in text
    assert "killed at task.rewardTimeout: 4" in text


@pytest.mark.slow  # seconds of subprocesses or models: `make test`, not `make unit`
def test_the_driver_scores_in_the_pool_logs_each_term_and_ends_the_pool(tmp_path, monkeypatch):
    """A run's loop around fakes: the plug-in's calls in worker processes, reward/<term> and the timeouts
    in the step records, and the workers gone when the run ends."""
    from rlscale.roles import RunEnd
    from rlscale.trainer.sinks import ClosesRewardPool
    from tests.trainer.test_driver_step import FakeRollout, driver

    class Answers:  # after the first step (every call stuck) the rollout answers "2"
        def after_step(self, plan, history):
            d.rollout.reply = "2"

    class Rollout(FakeRollout):  # the held-out eval before the first step (greedy) is answered "2"
        def generate(self, prompt_ids, n, temperature=1.0, **kw):
            reply, self.reply = self.reply, "2" if temperature == 0.0 else self.reply
            try:
                return super().generate(prompt_ids, n, **kw)
            finally:
                self.reply = reply

    (tmp_path / "drv_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    d = driver("hang", tmp_path, plan_source=Answers(), budget={"max_steps": 2}, batch={"samples_per_prompt": 2},
               task={"reward": "drv_plugin:score + exact-match", "reward_timeout": 1.0,
                     "reward_timeout_score": 0.0, "reward_workers": 2})
    d.task.reward = resolve_reward(d.spec.task.reward, timeout_s=d.spec.task.reward_timeout)
    d.rollout = Rollout("hang")
    assert d.run() == RunEnd.BUDGET
    first, second = d.records
    assert first.reward_timeouts == 4 and first.reward_mean == 0.0  # 2 prompts x 2 samples, each killed
    assert first.reward_terms == {"exact-match": 0.0}  # the killed calls have no value of the plug-in's
    # "2" is 1+1= right and 2+2= wrong: exact-match's own mean is 0.5, the plug-in's len("2") = 1.
    assert second.reward_timeouts == 0 and second.reward_terms == {"drv_plugin:score": 1.0, "exact-match": 0.5}
    assert any(isinstance(s, ClosesRewardPool) for s in d.sinks)
    assert d.task.reward.pool is None  # closed at the run's end
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward_timeouts"] for r in logged] == [4, 0] and logged[1]["reward_terms"]["exact-match"] == 0.5
