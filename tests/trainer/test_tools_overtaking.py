"""Trajectories overtaking each other across turns (MultiTurnRollout(overtake=True), trainer/tools/overtaking.py),
against scripted policies behind the rollout port, the real tiny-tools tokenizer and the real sandboxed
calculator: the trajectories come out as the turn-by-turn loop makes them, a trajectory whose tool answers late
holds back only itself, each trajectory-turn has its own seed however the calls group it, and an error in a
generate call or a step reaches the caller."""

from __future__ import annotations

import threading
import time

import pytest

from rlscale.trainer.tools.environments import Turn
from rlscale.trainer.tools.loop import _TURN_SEED, MultiTurnRollout
from tests.trainer.test_tools_loop import GuessEnv, ScriptedPolicy, call

FIELDS = ("token_ids", "logprobs", "mask", "text", "turns", "tool_calls", "tool_errors", "finish_reason",
          "env_reward", "turn_starts", "turn_rewards", "weights_version", "done")


class Recording(ScriptedPolicy):
    """ScriptedPolicy that records, per generate call, when it was made, its contexts and its seeds."""

    def __init__(self, tok, first):
        super().__init__(tok, first)
        self.log, self.lock = [], threading.Lock()

    def generate(self, prompt_ids, n, *, seed=None, **kw):
        with self.lock:
            texts = [self.tok.decode(p, skip_special_tokens=True) for p in prompt_ids]
            self.log.append((time.perf_counter(), texts, seed))
        return super().generate(prompt_ids, n, **kw)


class SlowFor:
    """The tools, with the answer to a call whose text holds `slow` delayed by `seconds` (its own thread waits)."""

    def __init__(self, tools, slow: str, seconds: float):
        self.inner, self.slow, self.seconds, self.answered = tools, slow, seconds, {}

    def step_many(self, texts):
        out = self.inner.step_many(texts)
        if any(self.slow in t for t in texts):
            time.sleep(self.seconds)
        for t in texts:
            self.answered[t] = time.perf_counter()
        return out

    @property
    def pool(self):
        return self.inner.pool


def prompts(tok, texts):
    return [tok(t).input_ids for t in texts]


def rollouts(tok, tools, first, **kw):
    args = {"max_turns": 3, "max_tokens": 64, "max_length": 96, "tools": tools, **kw}
    return (MultiTurnRollout(Recording(tok, first), tok, **args),
            MultiTurnRollout(Recording(tok, first), tok, overtake=True, **args))


def test_overtaking_makes_the_same_trajectories(tok, tools):
    # Half the prompts call the calculator, half answer at once; one call is malformed.
    def first(text):
        return "99" if text.startswith("1") else "<tool_call>{oops</tool_call>" if text.startswith("5") else \
            call(text.rstrip("="))

    sync, fast = rollouts(tok, tools, first)
    ids = prompts(tok, ["347*58=", "120*11=", "512*3=", "7*6="])
    a = sync.generate(ids, 2, temperature=1.0, top_p=1.0, max_new_tokens=16, seed=3, version=2)
    b = fast.generate(ids, 2, temperature=1.0, top_p=1.0, max_new_tokens=16, seed=3, version=2)
    for ga, gb in zip(a, b, strict=True):
        for ta, tb in zip(ga, gb, strict=True):
            assert {f: getattr(tb, f) for f in FIELDS} == {f: getattr(ta, f) for f in FIELDS}
    assert [t.text for g in b for t in g][:4] + [t.text for t in b[3]] == ["20126"] * 2 + ["99"] * 2 + ["42"] * 2
    # the malformed call is answered with an error, too long for the trajectory's 64 tokens: cut
    assert (b[2][0].tool_errors, b[2][0].turns, b[2][0].finish_reason) == (1, 1, "length")


def test_a_slow_tool_holds_back_only_its_own_trajectory(tok, tools):
    slow = SlowFor(tools, "347", 1.0)
    _, fast = rollouts(tok, slow, lambda text: call(text.rstrip("=")))
    ids = prompts(tok, ["347*58=", "120*11=", "12*12="])
    (g0, g1, g2) = fast.generate(ids, 1, temperature=1.0, top_p=1.0, max_new_tokens=16, seed=0)
    assert [g[0].text for g in (g0, g1, g2)] == ["20126", "1320", "144"]
    log = fast.inner.log
    assert len(log[0][1]) == 3  # the first turns together
    later = [(when, ctx) for when, ctx, _ in log[1:]]
    slow_at = next(when for when, ctx in later if any(c.startswith("347") for c in ctx))
    fast_at = [when for when, ctx in later if not any(c.startswith("347") for c in ctx)]
    # The fast trajectories' second turns went out before the slow tool answered, the slow one's after it.
    slow_answered = slow.answered[call("347*58")]
    assert fast_at and max(fast_at) < slow_answered - 0.5 and slow_at >= slow_answered
    assert g0[0].tool_wall > 0.5 and g1[0].tool_wall < 0.5  # the wait was the slow trajectory's


def test_each_trajectory_turn_has_its_own_seed(tok, tools):
    slow = SlowFor(tools, "347", 0.3)
    _, fast = rollouts(tok, slow, lambda text: call(text.rstrip("=")))
    fast.generate(prompts(tok, ["120*11=", "347*58=", "12*12="]), 1, temperature=1.0, top_p=1.0,
                  max_new_tokens=16, seed=100)
    order = ["120*11=", "347*58=", "12*12="]
    seen = {}
    for _, contexts, seeds in fast.inner.log:
        for ctx, s in zip(contexts, seeds, strict=True):
            seen[(next(p for p in order if ctx.startswith(p)), "<tool_response>" in ctx)] = s
    assert len(fast.inner.log) >= 3  # the slow trajectory's second turn went in a call of its own
    for i, p in enumerate(order):
        assert seen[(p, False)] == 100 + i and seen[(p, True)] == 100 + _TURN_SEED + i


def test_a_plugin_environment_overtakes_too(tok):
    def run(overtake):
        guesses = {}

        def first(text):  # the first trajectory of each prompt guesses wrong once
            guesses[text] = guesses.get(text, 0) + 1
            return "1" if text.endswith("guess:") and guesses[text] == 1 else "7"

        p = prompts(tok, ["7?"])[0]
        r = MultiTurnRollout(ScriptedPolicy(tok, first), tok, max_turns=3, max_tokens=64, max_length=96,
                             environment=GuessEnv, rows={tuple(p): {"answer": "7"}}, overtake=overtake)
        return r.generate([p], 2, temperature=1.0, top_p=1.0, max_new_tokens=8)[0]

    a, b = run(False), run(True)
    assert [t.env_reward for t in b] == pytest.approx([t.env_reward for t in a])
    assert [(t.turns, t.turn_rewards, t.mask) for t in b] == [(t.turns, t.turn_rewards, t.mask) for t in a]


def test_an_error_in_a_call_or_a_step_reaches_the_caller(tok, tools):
    class Broken(ScriptedPolicy):
        def generate(self, prompt_ids, n, **kw):
            if len(self.calls) == 1:
                raise RuntimeError("replica gone")
            return super().generate(prompt_ids, n, **kw)

    r = MultiTurnRollout(Broken(tok, lambda text: call("1+1")), tok, max_turns=3, max_tokens=64, max_length=96,
                         tools=tools, overtake=True)
    with pytest.raises(RuntimeError, match="replica gone"):
        r.generate(prompts(tok, ["1+1="]), 2, temperature=1.0, top_p=1.0, max_new_tokens=16)

    class Failing:
        pool = tools.pool

        def step_many(self, texts):
            raise ValueError("spec.task.environment: step returned junk")

    r = MultiTurnRollout(ScriptedPolicy(tok, lambda text: call("1+1")), tok, max_turns=3, max_tokens=64,
                         max_length=96, tools=Failing(), overtake=True)
    with pytest.raises(ValueError, match="junk"):
        r.generate(prompts(tok, ["1+1="]), 2, temperature=1.0, top_p=1.0, max_new_tokens=16)
    assert Turn("").done is False


def test_the_spec_turns_it_on(tok):
    from rlscale.spec import parse_spec
    from rlscale.trainer.tools.setup import multi_turn

    task = {"environment": "tests.trainer.test_tools_loop:GuessEnv", "maxTurns": 3}
    for on in (False, True):
        spec = parse_spec({"hardware": {"accelerator": "cpu"}, "task": {**task, "overtakeTurns": on}})
        r = multi_turn(spec, ScriptedPolicy(tok, lambda text: "7"), tok, [], lambda t, p: [])
        assert r.overtake is on
