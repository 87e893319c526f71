"""Tasks, the prompt iterator, rewards, the tokenizer and the noise-scale estimator."""

from __future__ import annotations

import math
import sys
import textwrap

import pytest

from rlscale.trainer.data import load_task
from rlscale.trainer.noise import NoiseScale, noise_components
from rlscale.trainer.rewards import RewardError, exact_match, resolve_reward, score, strict_match
from rlscale.trainer.tasks import ArithmeticTask, PromptIterator


def test_arithmetic_split_is_the_calibrated_one_and_deterministic():
    task = ArithmeticTask(difficulty=1, seed=0)
    assert len(task.train) == 7600 and len(task.eval) == 500
    assert not {p.prompt for p in task.train} & {p.prompt for p in task.eval}
    p = task.train[0]
    a, b = p.prompt.rstrip("=").split("+")
    assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99 and p.answer == str(int(a) + int(b))
    assert ArithmeticTask(difficulty=1, seed=0).eval == task.eval
    assert ArithmeticTask(difficulty=1, seed=1).eval != task.eval


@pytest.mark.parametrize("level", [0, 2, 3])
def test_other_levels_have_correct_answers(level):
    task = ArithmeticTask(difficulty=level, seed=0)
    for p in task.train[:200] + task.eval[:200]:
        assert eval(p.prompt.rstrip("=")) == int(p.answer)  # noqa: S307 - our own generated digits
    assert len(task.eval) > 0


def test_level_2_lists_every_sum_and_difference_once():
    """Problems are made when read (trainer/tasks.py): the index arithmetic covers each pair once."""
    task = ArithmeticTask(difficulty=2, seed=0)
    prompts = [p.prompt for p in list(task.train) + task.eval]
    expected = {f"{a}+{b}=" for a in range(10, 100) for b in range(10, 100)}
    expected |= {f"{a}-{b}=" for a in range(10, 100) for b in range(10, a + 1)}
    assert len(prompts) == len(set(prompts)) and set(prompts) == expected


def test_unknown_task_and_level_name_the_field():
    with pytest.raises(ValueError, match="spec.task.name"):
        load_task("gsm8k")
    with pytest.raises(ValueError, match="task difficulty: 7"):
        ArithmeticTask(difficulty=7)


def test_prompt_iterator_restores_exactly_across_epochs():
    task = ArithmeticTask(difficulty=0, seed=0)  # 80 training problems: epochs turn over quickly
    it = PromptIterator(task.train, seed=3)
    first_epoch = it.next_batch(len(task.train))
    assert sorted(p.prompt for p in first_epoch) == sorted(p.prompt for p in task.train)
    it.next_batch(50)
    state = it.state_dict()
    expected = it.next_batch(70)  # crosses into the third epoch
    again = PromptIterator(task.train, seed=3)
    again.load_state_dict(state)
    assert again.next_batch(70) == expected
    assert PromptIterator(task.train, seed=4).next_batch(10) != PromptIterator(task.train, seed=3).next_batch(10)


def test_rewards():
    assert exact_match("23+58=", "81", "81", finished=True) == 1.0
    assert exact_match("23+58=", "811", "81", finished=True) == 0.0
    # The builtin model's warm start keeps its recipe's reward: the digits, then EOS.
    assert strict_match("23+58=", "81", "81", finished=False) == 0.0
    fmt = resolve_reward("format")
    assert fmt("23+58=", "80", "81", finished=True) == 1.0
    assert fmt("23+58=", "8+0", "81", finished=True) == 0.0
    assert resolve_reward("exact-match+0.1*format")("1+1=", "2", "2", finished=True) == pytest.approx(1.1)


def test_each_term_is_scored_on_its_own_without_a_pool(tmp_path, monkeypatch):
    """Outside a run (validate, a plain score call) the plug-in runs in a thread, the builtins in place;
    each term's values come back unweighted beside the weighted rewards."""
    from rlscale.trainer.rewards import score_terms

    (tmp_path / "term_rewards.py").write_text("def half(prompt, completion, answer, extra):\n    return 0.5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    r = resolve_reward("0.5*exact-match + 2*term_rewards:half")
    assert [t.safe for t in r.terms] == [True, False] and r.pool is None
    got = score_terms(r, ["1+1=", "2+2="], ["2", "5"], ["2", "4"], [True, True])
    assert got.rewards == pytest.approx([1.5, 1.0]) and got.timeouts == 0
    assert got.terms == {"exact-match": [1.0, 0.0], "term_rewards:half": [0.5, 0.5]}
    assert got.term_means() == {"exact-match": 0.5, "term_rewards:half": 0.5}
    sys.modules.pop("term_rewards", None)


def test_plugin_reward_by_module_function(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent("""
        def length(prompt, completion, answer, *, finished):
            return len(completion)
        def bad(prompt, completion, answer, *, finished):
            return "yes"
        NOT_CALLABLE = 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = resolve_reward("my_rewards:length")
    assert score(fn, ["1+1="], ["123"], ["2"], [True]) == [3.0]
    with pytest.raises(RewardError, match="must return a float"):
        score(resolve_reward("my_rewards:bad"), ["1+1="], ["2"], ["2"], [True])
    with pytest.raises(ValueError, match="no callable 'NOT_CALLABLE'"):
        resolve_reward("my_rewards:NOT_CALLABLE")
    with pytest.raises(ValueError, match="cannot be imported"):
        resolve_reward("no_such_module_xyz:f")
    with pytest.raises(ValueError, match="spec.task.reward"):
        resolve_reward("exact")
    sys.modules.pop("my_rewards", None)


def test_plugin_reward_from_the_folder_the_pods_mount_it_in(tmp_path, monkeypatch):
    """On Kubernetes, task.pluginVolume's files are found through RLSCALE_PLUGINS (the operator
    sets it), ahead of a module of the same name elsewhere on the path."""
    plugins, elsewhere = tmp_path / "plugins", tmp_path / "elsewhere"
    for folder, value in ((plugins, 1.0), (elsewhere, 0.0)):
        folder.mkdir()
        (folder / "pod_reward.py").write_text(f"def score(prompt, completion, answer, extra):\n    return {value}\n")
    monkeypatch.setattr(sys, "path", [str(elsewhere), *sys.path])
    monkeypatch.setenv("RLSCALE_PLUGINS", str(plugins))
    sys.modules.pop("pod_reward", None)
    try:
        assert score(resolve_reward("pod_reward:score"), ["1+1="], ["2"], ["2"], [True]) == [1.0]
    finally:
        sys.modules.pop("pod_reward", None)
    monkeypatch.delenv("RLSCALE_PLUGINS")
    with pytest.raises(ValueError, match="task.pluginVolume"):
        resolve_reward("not_shipped_anywhere:score")


def test_noise_components_recover_known_values():
    # With true |G|^2 = 4 and tr(Sigma) = 64: E|G_B|^2 = |G|^2 + tr(Sigma)/B.
    g_sq, trace = 4.0, 64.0
    small, big = g_sq + trace / 8, g_sq + trace / 128
    est_g, est_trace = noise_components(small, big, 8, 128)
    assert est_g == pytest.approx(g_sq) and est_trace == pytest.approx(trace)
    with pytest.raises(ValueError, match="b_small < b_big"):
        noise_components(1.0, 1.0, 8, 8)


def test_noise_scale_smooths_before_dividing():
    ns = NoiseScale(decay=0.5)
    assert ns.value is None
    ns.update(4 + 64 / 8, 4 + 64 / 128, 8, 128)
    assert ns.value == pytest.approx(16.0)
    # A noisy measurement with negative |G|^2 does not make the estimate negative or infinite.
    ns.update(1.0, 2.0, 8, 128)
    assert ns.value is not None and math.isfinite(ns.value) and ns.value >= 0
    state = ns.state_dict()
    other = NoiseScale()
    other.load_state_dict(state)
    assert other.value == ns.value


def test_tokenizer_round_trip(small_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(small_model)
    assert len(tok) == 17
    ids = tok("23+58=").input_ids
    assert ids[0] == tok.bos_token_id and len(ids) == 7
    assert tok.decode(ids, skip_special_tokens=True) == "23+58="
    assert tok.decode(tok("81", add_special_tokens=False).input_ids + [tok.eos_token_id]) == "81<eos>"
