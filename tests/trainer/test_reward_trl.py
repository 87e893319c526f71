"""TRL-style batched rewards, `fn(prompts, completions, **columns) -> list[float]`, taken as they are: called once a
batch, with the dataset's other columns as keyword lists, in the driver's thread or in a worker process of their own,
None (does not apply) adding 0 and left out of the term's mean; what they cannot be given is refused naming it."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

from rlscale.trainer.rewards import RewardError, resolve_reward, score_terms

# Written as TRL's documentation writes reward functions: keywords only, lists in, a list out.
TRL_REWARDS = textwrap.dedent("""
    import os, re, time

    def _log(name, n):
        if os.environ.get("TRL_REWARD_LOG"):
            with open(os.environ["TRL_REWARD_LOG"], "a") as f:
                f.write(f"{name} {n} {os.getpid()}\\n")


    def reward_len(completions, **kwargs):
        \"\"\"Prefers completions near 6 characters.\"\"\"
        _log("len", len(completions))
        return [-abs(6 - len(completion)) / 6 for completion in completions]


    def accuracy(prompts, completions, solution, **kwargs):
        \"\"\"1 where the completion is the row's solution; None where the row has none (another task's row).\"\"\"
        _log("acc", len(completions))
        return [None if s is None else float(c.strip() == str(s)) for c, s in zip(completions, solution)]


    def level_only(completions, level):
        \"\"\"No **kwargs: only the column it names is passed.\"\"\"
        return [float(lv) for lv in level]


    def wrong_length(completions, **kwargs):
        return [1.0]


    def not_numbers(completions, **kwargs):
        return ["yes" for _ in completions]


    def slow(completions, **kwargs):
        time.sleep(5)
        return [1.0 for _ in completions]


    def needs_ids(completions, completion_ids, **kwargs):
        return [float(len(i)) for i in completion_ids]
""")


@pytest.fixture
def trl_module(tmp_path, monkeypatch):
    (tmp_path / "trl_rewards.py").write_text(TRL_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "trl_rewards", raising=False)  # this test's file, not another test's
    monkeypatch.setenv("RLSCALE_PLUGINS", str(tmp_path))  # the pool's workers find it as pods do
    log = tmp_path / "calls.log"
    monkeypatch.setenv("TRL_REWARD_LOG", str(log))
    return log


def batch():
    """Four samples of two rows; the second row has no solution (None) and a level."""
    prompts = ["What is 2+2?"] * 2 + ["Say hi"] * 2
    completions = ["4", "five!", "hi", "hello there"]
    answers = ["4", "4", "", ""]
    extras = [{"solution": "4", "level": 1, "prompt": "What is 2+2?"}] * 2 + [{"level": 3}] * 2
    return prompts, completions, answers, [True] * 4, extras


def calls(log):
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def test_a_trl_function_is_called_once_a_batch_with_the_columns(trl_module):
    r = resolve_reward("0.5*trl_rewards:reward_len + trl_rewards:accuracy + 0.25*exact-match")
    assert [t.batched for t in r.terms] == [True, True, False]
    got = score_terms(r, *batch())
    # reward_len: -|6 - len|/6; accuracy: 1, 0, then None (0 in the sum); exact-match against the answer column.
    lens = [-abs(6 - len(c)) / 6 for c in batch()[1]]
    want = [0.5 * lens[0] + 1 + 0.25, 0.5 * lens[1], 0.5 * lens[2], 0.5 * lens[3]]
    assert got.rewards == pytest.approx(want)
    # The None rows are out of accuracy's mean: 1 of the 2 rows it judged.
    assert got.term_means()["trl_rewards:accuracy"] == pytest.approx(0.5)
    assert got.term_means()["trl_rewards:reward_len"] == pytest.approx(sum(lens) / 4)
    assert sorted((name, n) for name, n, _ in calls(trl_module)) == [("acc", "4"), ("len", "4")]


def test_without_kwargs_only_the_named_columns_are_passed(trl_module):
    got = score_terms(resolve_reward("trl_rewards:level_only"), *batch())
    assert got.rewards == [1.0, 1.0, 3.0, 3.0]


def test_in_the_worker_process_once_a_batch_and_closed_with_the_run(trl_module):
    r = resolve_reward("trl_rewards:reward_len + trl_rewards:accuracy", timeout_s=5.0)
    assert r.start_pool(workers=2)
    assert r.pool is None and r.batch_pool is not None  # no per-sample term: only the batch worker
    worker = r.batch_pool.workers[0].proc
    try:
        got = score_terms(r, *batch())
        again = score_terms(r, *[v[:2] for v in batch()])
    finally:
        r.close()
    lens = [-abs(6 - len(c)) / 6 for c in batch()[1]]
    assert got.rewards == pytest.approx([lens[0] + 1, lens[1], lens[2], lens[3]])
    assert again.rewards == pytest.approx(got.rewards[:2])
    logged = calls(trl_module)
    assert sorted((name, n) for name, n, _ in logged) == [("acc", "2"), ("acc", "4"), ("len", "2"), ("len", "4")]
    assert {pid for *_, pid in logged} == {str(worker.pid)} and str(os.getpid()) != str(worker.pid)
    assert r.batch_pool is None and not worker.is_alive()


@pytest.mark.slow  # waits out a timeout or a killed worker by design (seconds): `make test`, not `make unit`
def test_a_batch_past_its_timeout_is_killed_and_scores_the_timeout_score(trl_module):
    r = resolve_reward("trl_rewards:slow", timeout_s=0.5)  # 2 completions: 1 s for the batch
    assert r.start_pool(timeout_score=-1.0)
    try:
        got = score_terms(r, *[v[:2] for v in batch()])
        assert got.rewards == [-1.0, -1.0] and got.timeouts == 2
        r.timeout_score = None
        with pytest.raises(RewardError, match=r"took more than 1 s on a batch of 2 completions"):
            score_terms(r, *[v[:2] for v in batch()])
    finally:
        r.close()


@pytest.mark.parametrize(("name", "message"), [
    ("wrong_length", r"returned 1 values for a batch of 4 completions"),
    ("not_numbers", r"returned 'yes' \(str\) for prompt 'What is 2\+2\?'"),
])
def test_bad_values_stop_the_run_naming_the_function(trl_module, name, message):
    with pytest.raises(RewardError, match=message):
        score_terms(resolve_reward(f"trl_rewards:{name}"), *batch())


def test_what_rlscale_cannot_pass_is_refused_when_resolved(trl_module):
    with pytest.raises(ValueError, match=r"trl_rewards:needs_ids.*'completion_ids'.*give it a default"):
        resolve_reward("trl_rewards:needs_ids")


def test_a_per_sample_plugin_is_still_called_per_sample(tmp_path, monkeypatch):
    (tmp_path / "per_sample.py").write_text("def score(prompt, completion, answer, extra):\n    return 2.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    r = resolve_reward("per_sample:score")
    assert not r.terms[0].batched
    assert score_terms(r, *batch()).rewards == [2.0] * 4
