"""The multi-turn loop against a scripted policy behind the rollout port, with the real tokenizer of
builtin:tiny-tools and the real sandboxed calculator: trajectories run turn by turn, every unfinished one in
one generate call per turn; observation tokens are masked; malformed calls, maxTurns and the token budget
end or answer trajectories without an exception; the driver trains on the masks and records the tool figures."""

from __future__ import annotations

import re
from dataclasses import replace
from types import SimpleNamespace

import pytest

from rlscale.plan import make_plan
from rlscale.spec import load_rlrun
from rlscale.trainer.driver import Driver, Task, evaluate_task
from rlscale.trainer.plan_source import FixedPlan
from rlscale.trainer.rewards import resolve_reward
from rlscale.trainer.sinks import RunLog
from rlscale.trainer.tasks import Problem
from rlscale.trainer.tools.loop import MultiTurnRollout, decode_samples, tool_metrics
from rlscale.trainer.tools.task import CALL_PREFIX, CALL_SUFFIX
from tests.conftest import EXAMPLES
from tests.trainer.test_driver_step import FakeLearner, FakeRollout, Recorder


class ScriptedPolicy(FakeRollout):
    """Reads the context as text: with no tool response yet it writes `first(prompt)`, after one it copies
    the response's number as its answer. Records each generate call's number of contexts."""

    def __init__(self, tok, first):
        super().__init__("")
        self.tok, self.first, self.calls, self.answers = tok, first, [], True

    def generate(self, prompt_ids, n, *, max_new_tokens, **_):
        assert n == 1
        self.calls.append(len(prompt_ids))
        out = []
        for ids in prompt_ids:
            text = self.tok.decode(ids, skip_special_tokens=True)
            responses = re.findall(r"<tool_response>(.*?)</tool_response>", text)
            reply = responses[-1] if responses and self.answers else self.first(text)
            tokens = self.tok(reply, add_special_tokens=False).input_ids + [self.tok.eos_token_id]
            cut = len(tokens) > max_new_tokens
            tokens = tokens[:max_new_tokens]
            out.append([SimpleNamespace(token_ids=tokens, logprobs=[-0.5] * len(tokens),
                                        finish_reason="length" if cut else "stop", weights_version=3)])
        return out


def call(expr: str) -> str:
    return f"<tool_call>{CALL_PREFIX}{expr}{CALL_SUFFIX}</tool_call>"


def rollout(tok, tools, first, **kw):
    args = {"max_turns": 3, "max_tokens": 64, "max_length": 96, **kw}
    return MultiTurnRollout(ScriptedPolicy(tok, first), tok, tools=tools, **args)


def prompts(tok, texts):
    return [tok(t).input_ids for t in texts]


def test_a_call_then_an_answer_with_the_observation_masked(tok, tools):
    r = rollout(tok, tools, lambda text: call(text.rstrip("=")))
    groups = r.generate(prompts(tok, ["347*58=", "120*11="]), 2, temperature=1.0, top_p=1.0, max_new_tokens=16,
                        seed=5, version=3)
    trajs = [t for g in groups for t in g]
    assert [t.text for t in trajs] == ["20126", "20126", "1320", "1320"]
    assert r.inner.calls == [4, 4]  # every trajectory in one generate call per turn
    t = trajs[0]
    assert (t.turns, t.tool_calls, t.tool_errors, t.finish_reason, t.weights_version) == (2, 1, 0, "stop", 3)
    observation = tok("<tool_response>20126</tool_response>", add_special_tokens=False).input_ids
    call_ids = tok(call("347*58"), add_special_tokens=False).input_ids + [tok.eos_token_id]
    answer = tok("20126", add_special_tokens=False).input_ids + [tok.eos_token_id]
    assert t.token_ids == call_ids + observation + answer
    assert t.mask == [1] * len(call_ids) + [0] * len(observation) + [1] * len(answer)
    assert t.logprobs[len(call_ids):len(call_ids) + len(observation)] == [0.0] * len(observation)
    assert decode_samples(tok, trajs) == [t.text for t in trajs]
    m = tool_metrics(trajs)
    assert m["turns"] == 2 and m["calls"] == 4 and m["errors"] == 0 and m["truncated"] == 0 and m["with_calls"] == 1


def test_a_direct_answer_is_one_turn(tok, tools):
    r = rollout(tok, tools, lambda text: "42")
    (g,) = r.generate(prompts(tok, ["6*7="]), 1, temperature=1.0, top_p=1.0, max_new_tokens=16)
    assert (g[0].turns, g[0].tool_calls, g[0].text, g[0].mask) == (1, 0, "42", [1, 1, 1])


@pytest.mark.parametrize("bad, says", [("<tool_call>{oops</tool_call>", "not JSON"),
                                       (call("1/0"), "division by zero"),
                                       ('<tool_call>{"name": "shell", "arguments": {}}</tool_call>', "no tool named")])
def test_a_malformed_or_failing_call_is_answered_with_an_error_observation(tok, tools, bad, says):
    r = rollout(tok, tools, lambda text: bad, max_tokens=400, max_length=512)
    (g,) = r.generate(prompts(tok, ["6*7="]), 1, temperature=1.0, top_p=1.0, max_new_tokens=300)
    t = g[0]
    assert t.tool_calls == 1 and t.tool_errors == 1 and t.turns == 2
    assert says in t.text  # the scripted policy copies the observation: the model read the error
    short = rollout(tok, tools, lambda text: bad, max_tokens=40)  # no room for the error: the trajectory ends, cut
    (g,) = short.generate(prompts(tok, ["6*7="]), 1, temperature=1.0, top_p=1.0, max_new_tokens=38)
    assert (g[0].turns, g[0].finish_reason, g[0].tool_errors) == (1, "length", 1)


def test_max_turns_and_the_token_budget_cut_trajectories(tok, tools):
    looping = rollout(tok, tools, lambda text: call("1+1"), max_turns=2)
    looping.inner.answers = False  # it calls the tool again and again
    (g,) = looping.generate(prompts(tok, ["1+1="]), 1, temperature=1.0, top_p=1.0, max_new_tokens=16)
    assert (g[0].turns, g[0].finish_reason, g[0].tool_calls) == (2, "length", 2)
    tight = rollout(tok, tools, lambda text: call("12*12"), max_tokens=14)
    (g,) = tight.generate(prompts(tok, ["12*12="]), 1, temperature=1.0, top_p=1.0, max_new_tokens=16)
    assert g[0].finish_reason == "length" and len(g[0].token_ids) <= 14


class GuessEnv:
    """A plug-in environment: guess the row's answer; each wrong guess costs 0.1, the right one gives 1."""

    def reset(self, row):
        self.answer = row["answer"]
        return "guess:"

    def step(self, action):
        if action.strip() == self.answer:
            return "", 1.0, True
        return "no", -0.1, False


def test_a_plugin_environment_steps_each_trajectory_and_adds_its_rewards(tok):
    guesses = iter(["1", "7", "7"])  # trajectory 0 guesses 1 then 7; trajectory 1 guesses 7 at once
    policy = ScriptedPolicy(tok, lambda text: next(guesses))
    p = prompts(tok, ["7?"])[0]
    r = MultiTurnRollout(policy, tok, max_turns=3, max_tokens=64, max_length=96, environment=GuessEnv,
                         rows={tuple(p): {"answer": "7"}})
    (g,) = r.generate([p], 2, temperature=1.0, top_p=1.0, max_new_tokens=8)
    assert [t.env_reward for t in g] == pytest.approx([0.9, 1.0]) and [t.turns for t in g] == [2, 1]
    assert policy.calls == [2, 1]  # the finished trajectory is not generated for again
    assert g[0].mask[:len(tok("guess:", add_special_tokens=False).input_ids)] == [0] * 6


def test_the_driver_trains_on_the_masks_and_records_tool_figures(tmp_path, tok, tools):
    rlrun = load_rlrun(EXAMPLES / "quickstart.yaml")
    spec = rlrun.spec.model_copy(deep=True)
    spec.task.max_new_tokens = 16
    problems = [Problem("347*58=", "20126", prompt_ids=tuple(tok("347*58=").input_ids)),
                Problem("12*12=", "144", prompt_ids=tuple(tok("12*12=").input_ids))]
    answers = iter(["0"] * 100)
    # the first prompt's trajectories call the tool (right), the second's answer directly (wrong)
    r = rollout(tok, tools, lambda text: call(text.rstrip("=")) if text.startswith("347") else next(answers))
    learner = FakeLearner()
    run_log = RunLog(tmp_path / "run", spec.target.value, spec.target.metric, "t", report=False)
    d = Driver(spec=spec, plan=replace(make_plan(spec), prompts=2), task=Task(problems, problems,
               resolve_reward("exact-match"), 16), tokenizer=tok, learner=learner, rollout=r, run_log=run_log,
               sinks=[run_log, Recorder()], plan_source=FixedPlan(), ckpt_dir=tmp_path / "ckpt", run_id="ns/t")
    rec = d.step()
    batch = learner.batches[0]
    n = spec.batch.samples_per_prompt
    assert batch.response_mask is not None and sorted(batch.rewards) == [0.0] * n + [1.0] * n
    assert all(0 in m for m, rw in zip(batch.response_mask, batch.rewards, strict=True) if rw == 1.0)
    assert rec.tools["calls"] == n and rec.tools["with_calls"] == 0.5 and rec.tools["turns"] == 1.5
    assert evaluate_task(r, tok, problems, resolve_reward("exact-match"), 16, 0)["eval/accuracy"] == 0.5


def test_trajectories_generated_ahead_keep_their_masks_through_a_checkpoint(tok, tools):
    from rlscale.trainer.pipeline import Rollouts
    from rlscale.trainer.tools.loop import response_masks

    r = rollout(tok, tools, lambda text: call(text.rstrip("=")))
    (g,) = r.generate(prompts(tok, ["12*12="]), 2, temperature=1.0, top_p=1.0, max_new_tokens=16)
    p = Problem("12*12=", "144", prompt_ids=tuple(tok("12*12=").input_ids))
    batch = Rollouts(1, 0, [p], [list(p.prompt_ids)], g, [t.text for t in g], [True, True], [1.0, 1.0], g)
    back = Rollouts.from_state(batch.to_state())
    assert response_masks(back.samples) == response_masks(g) and 0 in response_masks(g)[0]
    assert decode_samples(tok, back.samples) == ["144", "144"] and tool_metrics(back.samples) == tool_metrics(g)


def test_the_tool_task_and_its_tokenizer(tok):
    from rlscale.trainer.tools.task import ToolArithmeticTask, call_text
    from rlscale.trainer.tools.warm_start import demonstration

    task = ToolArithmeticTask()
    assert len(task.train) + len(task.eval) == 900 * 90 and len(task.eval) == 500
    assert not {p.prompt for p in task.eval} & {p.prompt for p in task.train[:5000]}
    p = Problem("347*58=", "20126")
    ids = tok(call_text(p), add_special_tokens=False).input_ids
    assert len(ids) == 10 and tok.decode(ids) == call(p.prompt.rstrip("="))  # exact Hermes text, 10 tokens
    full, labels = demonstration(tok, p, use_tool=True)
    shy, shy_labels = demonstration(tok, p, use_tool=True, decide=False)
    assert full == shy and [i for i, x in enumerate(labels) if x != shy_labels[i]] == [8]  # only <tool_call>
    observed = [t for t, lab in zip(full, labels, strict=True) if lab == -100]
    assert tok.decode(observed) == "<bos>347*58=<tool_response>20126</tool_response>"



def test_the_tool_tokenizer_survives_autotokenizer(tok, tmp_path):
    """The driver and vLLM load tokenizers with AutoTokenizer, which rebuilds this one as Qwen2's: the Hermes
    pieces must still be one token each (they are added tokens)."""
    import json

    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))  # what the model directory says
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    text = call("347*58") + "<eos><tool_response>20126</tool_response>20126<eos>"
    assert loaded(text, add_special_tokens=False).input_ids == tok(text, add_special_tokens=False).input_ids


def test_a_runs_multi_turn_rollout_comes_from_its_spec(tok):
    from rlscale.spec import SpecError  # noqa: F401  (the spec is valid; a plug-in that does not import fails here)
    from rlscale.trainer.driver import prompt_tokens
    from rlscale.trainer.tools.setup import multi_turn

    spec = load_rlrun(EXAMPLES / "tools-quickstart.yaml").spec
    r = multi_turn(spec, ScriptedPolicy(tok, lambda text: "1"), tok, [], prompt_tokens)
    try:
        assert (r.max_turns, r.max_tokens, r.max_length) == (2, 36, 48) and set(r.tools.pool.tools) == {"calculator"}
        assert r.tools.pool.take_stats().isolation  # its first worker started, and said how it is isolated
    finally:
        r.close()
    bad = spec.model_copy(deep=True)
    bad.task.tools[0] = bad.task.tools[0].model_copy(update={"builtin": None, "function": "no_such_mod:f"})
    with pytest.raises(ImportError, match="no_such_mod"):
        multi_turn(bad, ScriptedPolicy(tok, lambda text: "1"), tok, [], prompt_tokens)


def test_validate_imports_the_plugin_tools_and_environment(tmp_path, monkeypatch):
    from rlscale.spec import parse_spec
    from rlscale.trainer.data import check_plugins

    (tmp_path / "myenv.py").write_text("class Game:\n    pass\n\ndef search(q=''):\n    return q\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    tools = [{"name": "s", "function": "myenv:search"}]
    ok = parse_spec({"hardware": {"accelerator": "cpu"}, "task": {"tools": tools}})
    assert check_plugins(ok.task) == []
    bad = parse_spec({"hardware": {"accelerator": "cpu"}, "task": {"environment": "myenv:Nope"}})
    (err,) = check_plugins(bad.task)
    assert err.path == "spec.task.environment" and "Nope" in str(err)
