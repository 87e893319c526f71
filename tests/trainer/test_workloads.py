"""Dataset tasks and rewards: files written here, read through the `datasets` library, rendered
with real tokenizers' chat templates; every reward on hand-written cases; bad rows and broken
rewards refused naming the row, the field and the fix."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from rlscale.spec import SpecError, parse_spec
from rlscale.trainer.data import build_task, check_workload, read_rows, render, use_chat
from rlscale.trainer.rewards import RewardError, extract_answer, resolve_reward, score
from tests.conftest import rlrun_dict, rlscale_cli

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def spec(task: dict, **model) -> object:
    return parse_spec({"model": {"maxLength": 128, **model}, "hardware": {"accelerator": "cpu"},
                       "task": {"maxNewTokens": 8, **task}})


@pytest.fixture(scope="module")
def char_tok():
    """The builtin model's character tokenizer: no chat template."""
    from rlscale.trainer.modeling import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="module")
def chat_tok(tmp_path_factory):
    """A small word-level tokenizer that carries a chat template, saved and loaded like a model's."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    words = ["<pad>", "<unk>", "<|end|>", "<|user|>", "<|system|>", "<|assistant|>"]
    plain = [str(i) for i in range(200)] + ["What", "is", "+", "?", "Be", "brief."]
    vocab = {w: i for i, w in enumerate(words + plain)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<|end|>",
                                   additional_special_tokens=words[3:])
    fast.chat_template = CHAT_TEMPLATE
    d = tmp_path_factory.mktemp("chat-tok")
    fast.save_pretrained(d)
    return AutoTokenizer.from_pretrained(d)


ROWS = [{"question": f"What is {a} + {b} ?", "solution": a + b, "level": a % 3}
        for a in range(10) for b in range(10)]


# --------------------------------------------------------------------------- datasets


def test_jsonl_field_mapping_extra_fields_and_a_seeded_held_out_split(tmp_path):
    f = write_jsonl(tmp_path / "sums.jsonl", ROWS)
    t = spec({"dataset": str(f), "promptField": "question", "answerField": "solution",
              "extraFields": ["level"], "evalFraction": 0.2, "seed": 3}).task
    train, held = read_rows(t)
    assert len(train) == 80 and len(held) == 20
    assert not {r.prompt for r in train} & {r.prompt for r in held}
    r = held[0]
    src = ROWS[r.index - 1]
    assert r.prompt == src["question"] and r.answer == str(src["solution"]) and r.extra == {"level": src["level"]}
    again = read_rows(t)[1]
    assert [x.index for x in again] == [x.index for x in held]  # the same held-out rows every time
    other = read_rows(spec({**t.model_dump(by_alias=True, exclude_none=True), "seed": 4}).task)[1]
    assert [x.index for x in other] != [x.index for x in held]
    # Unset extraFields: the whole row goes to the reward.
    whole = read_rows(spec({"dataset": str(f), "promptField": "question", "answerField": "solution"}).task)[0][0]
    assert set(whole.extra) == {"question", "solution", "level"}
    assert spec({"dataset": str(f)}).task.name == "sums"


def test_parquet_splits_from_a_folder_and_csv_and_save_to_disk(tmp_path):
    import datasets

    folder = tmp_path / "gsm"
    folder.mkdir()
    gsm = [{"question": f"q{i}", "answer": f"step {i} then\n#### {i * 2}"} for i in range(30)]
    datasets.Dataset.from_list(gsm[:20]).to_parquet(str(folder / "train.parquet"))
    datasets.Dataset.from_list(gsm[20:]).to_parquet(str(folder / "test.parquet"))
    t = spec({"dataset": str(folder), "promptField": "question", "evalSplit": "test", "evalSize": 4}).task
    train, held = read_rows(t)
    assert [r.prompt for r in train] == [f"q{i}" for i in range(20)]
    assert [r.prompt for r in held] == ["q20", "q21", "q22", "q23"]
    with pytest.raises(SpecError, match=r"spec.task.evalSplit: 'validation' is not a split .*it has: (train, "
                       r"test|test, train)"):
        read_rows(spec({"dataset": str(folder), "promptField": "question", "evalSplit": "validation"}).task)

    csv = tmp_path / "sums.csv"
    csv.write_text("prompt,answer\n1+1=,2\n2+2=,4\n3+3=,6\n")
    train, held = read_rows(spec({"dataset": str(csv), "evalFraction": 0.34}).task)
    assert len(train) == 2 and len(held) == 1 and {r.answer for r in train + held} == {"2", "4", "6"}

    saved = tmp_path / "saved"
    splits = {"train": datasets.Dataset.from_list(gsm[:10]), "dev": datasets.Dataset.from_list(gsm[10:14])}
    datasets.DatasetDict(splits).save_to_disk(str(saved))
    train, held = read_rows(spec({"dataset": str(saved), "promptField": "question", "evalSplit": "dev"}).task)
    assert len(train) == 10 and [r.prompt for r in held] == ["q10", "q11", "q12", "q13"]


# read_rows in a fresh interpreter (huggingface_hub reads HF_HOME when it is imported), for
# each (task.dataset, model) case: one line per case.
HUB_READ = """
import json, sys
from rlscale.spec import SpecError, parse_spec
from rlscale.trainer.data import dataset_on_cluster, read_rows
for dataset, model in json.loads(sys.argv[1]):
    s = parse_spec({"model": {"maxLength": 128, **model}, "hardware": {"accelerator": "cpu"},
                    "task": {"maxNewTokens": 8, "dataset": dataset, "promptField": "question", "evalSplit": "test"}})
    try:
        train, held = read_rows(s.task)
        got = {"train": [r.prompt for r in train], "held": [r.prompt for r in held]}
    except SpecError as exc:
        got = {"error": str(exc)}
    print("CASE", json.dumps({"on_cluster": dataset_on_cluster(s), **got}), flush=True)
"""


@pytest.mark.slow  # seconds of subprocesses or models: `make test`, not `make unit`
def test_a_hub_dataset_resolves_from_the_cache_with_its_folder(tmp_path):
    """`hf download acme/gsm --repo-type dataset` leaves the files under HF_HOME's hub cache;
    task.dataset names the dataset, or a folder of it (GSM8K keeps its configs as folders)."""
    import datasets

    snap = tmp_path / "hf" / "hub" / "datasets--acme--gsm" / "snapshots" / ("a" * 40)
    for config in ("main", "socratic"):
        (snap / config).mkdir(parents=True)
        for split, rng in (("train", range(0, 12)), ("test", range(12, 16))):
            rows = [{"question": f"{config} q{i}", "answer": f"#### {i}"} for i in rng]
            datasets.Dataset.from_list(rows).to_parquet(str(snap / config / f"{split}-00000-of-00001.parquet"))
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("a" * 40)
    volume = {"volume": {"persistentVolumeClaim": {"claimName": "models"}}}
    cases = [("acme/gsm/main", {}), ("acme/gsm/mian", {}), ("acme/absent/main", {}), ("acme/absent/main", volume)]
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "datasets-cache")}
    out = subprocess.run([sys.executable, "-c", HUB_READ, json.dumps(cases)],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    main, typo, absent, on_volume = [json.loads(ln[5:]) for ln in out.stdout.splitlines() if ln.startswith("CASE ")]
    assert main["train"] == [f"main q{i}" for i in range(12)] and main["held"] == [f"main q{i}" for i in range(12, 16)]
    assert not main["on_cluster"]
    assert typo["error"].startswith("spec.task.dataset: 'acme/gsm/mian'") and "main, socratic" in typo["error"], typo
    assert "is not in the Hugging Face cache" in absent["error"] and "hf download" in absent["error"], absent
    assert not absent["on_cluster"]
    # On a cluster the pods resolve it from the model volume's cache: `validate` leaves it to them.
    assert on_volume["on_cluster"]


@pytest.mark.parametrize("rows, field, problem", [
    ([{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2="}, {"prompt": "3+3=", "answer": "6"}],
     "answer", "row 2: field 'answer' is missing"),
    ([{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}, {"prompt": ["x"], "answer": "6"}],
     "prompt", "row 3: field 'prompt' is list"),
    ([{"prompt": "1+1=", "answer": "2"}, {"prompt": "", "answer": "4"}], "prompt",
     "row 2: field 'prompt' is str (0 characters)"),
    ([{"prompt": "1+1=", "answer": [2]}], "answer", "row 1: field 'answer' is list"),
])
def test_bad_rows_are_refused_naming_file_row_and_field(tmp_path, rows, field, problem):
    f = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(SpecError) as info:
        read_rows(spec({"dataset": str(f)}).task)
    (err,) = info.value.errors
    text = str(err)
    assert err.path == "spec.task.dataset" and str(f) in text and problem in text, text
    assert "1+1=" not in text and "'x'" not in text  # the rows' values are never quoted


def test_a_missing_column_names_the_mapping_field_and_the_columns(tmp_path):
    f = write_jsonl(tmp_path / "q.jsonl", ROWS[:5])
    with pytest.raises(SpecError, match=r"spec.task.promptField: 'prompt' is not a column of .*columns: question, "
                       r"solution, level"):
        read_rows(spec({"dataset": str(f), "answerField": "solution"}).task)
    with pytest.raises(SpecError, match=r"spec.task.extraFields: 'difficulty' is not a column"):
        read_rows(spec({"dataset": str(f), "promptField": "question", "answerField": "solution",
                        "extraFields": ["difficulty"]}).task)
    with pytest.raises(SpecError, match="spec.task.dataset: .* does not exist"):
        read_rows(spec({"dataset": str(tmp_path / "nope.jsonl")}).task)
    (tmp_path / "broken.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": \n')
    with pytest.raises(SpecError, match=r"spec.task.dataset: .*broken.jsonl' cannot be read"):
        read_rows(spec({"dataset": str(tmp_path / "broken.jsonl")}).task)


def test_chat_template_rendering_is_the_tokenizers_own(tmp_path, chat_tok, char_tok):
    f = write_jsonl(tmp_path / "q.jsonl", ROWS[:10])
    s = spec({"dataset": str(f), "promptField": "question", "answerField": "solution", "systemPrompt": "Be brief.",
              "evalFraction": 0.2})
    task = build_task(s, chat_tok)
    assert task.chat
    p = task.train[0]
    question = p.extra["question"]
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]
    assert p.prompt == chat_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert list(p.prompt_ids) == chat_tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)[
        "input_ids"]
    assert p.prompt == f"<|system|>Be brief.<|end|><|user|>{question}<|end|><|assistant|>"

    # chat: false gives the plain text; a template-less model with chat unset, too.
    plain = build_task(spec({**s.task.model_dump(by_alias=True, exclude_none=True), "chat": False}), chat_tok)
    assert not plain.chat and plain.train[0].prompt == f"Be brief.\n\n{question}"
    with pytest.raises(SpecError, match="spec.task.chat: true asks for a chat template, but the model has none"):
        use_chat(spec({"chat": True}).task, char_tok)


def test_messages_field_goes_through_the_template(tmp_path, chat_tok, char_tok):
    rows = [{"messages": [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": f"What is {i} + 1 ?"}],
             "answer": str(i + 1)} for i in range(10)]
    f = write_jsonl(tmp_path / "chat.jsonl", rows)
    s = spec({"dataset": str(f), "messagesField": "messages", "systemPrompt": "ignored: the row has its own"})
    task = build_task(s, chat_tok)
    p = next(q for q in task.train + task.eval if q.answer == "4")
    assert list(p.prompt_ids) == chat_tok.apply_chat_template(rows[3]["messages"], add_generation_prompt=True)[
        "input_ids"]
    with pytest.raises(SpecError, match="spec.task.messagesField: 'messages' holds chat messages, but the model has no "
                       "chat template"):
        build_task(s, char_tok)
    rows[4]["messages"][1]["role"] = "narrator"
    with pytest.raises(SpecError, match=r"row 5: field 'messages\[1\]' is dict .*each message needs a role"):
        read_rows(spec({"dataset": str(write_jsonl(tmp_path / "bad.jsonl", rows)), "messagesField": "messages"}).task)


def test_overlong_prompts_are_dropped_at_load_with_a_count(tmp_path, char_tok, caplog):
    rows = [{"prompt": "1+1=", "answer": "2"}] * 8 + [{"prompt": "1" * 40 + "+1=", "answer": "0"}] * 2
    f = write_jsonl(tmp_path / "long.jsonl", rows)
    s = parse_spec({"model": {"maxLength": 24}, "hardware": {"accelerator": "cpu"},
                    "task": {"dataset": str(f), "maxNewTokens": 4, "expectedPromptTokens": 8, "evalFraction": 0.2}})
    with caplog.at_level(logging.WARNING, logger="rlscale.data"):
        task = build_task(s, char_tok)
    assert len(task.train) + len(task.eval) == 8 and sum(task.dropped.values()) == 2
    assert "dropped" in caplog.text and "= 20 tokens" in caplog.text
    assert all(len(p.prompt_ids) <= 20 for p in task.train)
    s.model.max_length = 8  # room for no prompt at all: an error naming the field and the length needed
    with pytest.raises(SpecError, match=r"spec.model.maxLength: 8 leaves no room .* raise maxLength to at least"):
        build_task(s, char_tok)


def test_the_builtin_task_renders_exactly_as_before(char_tok):
    task = build_task(parse_spec({"hardware": {"accelerator": "cpu"}}), char_tok)
    assert len(task.train) == 7600 and len(task.eval) == 500 and not task.chat
    p = task.train[0]
    assert list(p.prompt_ids) == char_tok(p.prompt).input_ids


# --------------------------------------------------------------------------- rewards


@pytest.mark.parametrize("completion, answer, expected", [
    ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "She sold 48/2 = 24 in May.\n#### 72", 1.0),
    ("#### 1,234", "1234", 1.0),
    ("So the answer is \\boxed{42}.", "42", 1.0),
    ("\\boxed{\\frac{1}{2}} is 3 steps", "\\frac{1}{2}", 1.0),
    ("7 + 5 = 12.", "12", 1.0),
    ("7 + 5 = 12. Then 3", "12", 0.0),  # the last number decides
    ("twelve", "12", 0.0),
    ("12.0", "12", 1.0),
    ("Paris", "Paris", 1.0),
])
def test_exact_match_extracts_the_answer(completion, answer, expected):
    assert resolve_reward("exact-match")("q", completion, answer) == expected


def test_extract_answer_order():
    assert extract_answer("\\boxed{3} but #### 4") == "4"
    assert extract_answer("a \\boxed{x^{2}} b 7") == "x^{2}"
    assert extract_answer("no numbers here ") == "no numbers here"


@pytest.mark.parametrize("completion, answer, expected", [
    ("The answer is $\\frac{1}{2}$", "0.5", 1.0),
    ("0.5", "1/2", 1.0),
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", 1.0),
    ("x = 3", "3", 1.0),
    ("\\boxed{0.25}", "1/2", 0.0),
    ("#### 72", "blah\n#### 72", 1.0),
])
def test_math_reward_uses_math_verify_equivalence(completion, answer, expected):
    assert resolve_reward("math")("q", completion, answer) == expected


def test_format_and_weighted_sums():
    r = resolve_reward("0.9*math + 0.1*format", format_pattern=r"(?s).*\\boxed\{.+\}.*")
    assert r("q", "so \\boxed{1/2}", "0.5") == pytest.approx(1.0)
    assert r("q", "so 0.5", "0.5") == pytest.approx(0.9)
    assert r("q", "\\boxed{7}", "0.5") == pytest.approx(0.1)


def test_plugins_get_prompt_completion_answer_and_extra(tmp_path, monkeypatch):
    (tmp_path / "wl_rewards.py").write_text(textwrap.dedent("""
        import math, time
        def by_level(prompt, completion, answer, extra):
            return float(completion == answer) * (1 + extra["level"])
        def finished_only(prompt, completion, answer, *, finished):
            return 1.0 if finished else 0.0
        def nan(prompt, completion, answer, extra):
            return math.nan
        def slow(prompt, completion, answer, extra):
            time.sleep(30)
            return 1.0
        def boom(prompt, completion, answer, extra):
            raise KeyError("level")
        def two(prompt, completion):
            return 1.0
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert score(resolve_reward("wl_rewards:by_level"), ["p", "p"], ["3", "4"], ["3", "3"], [True, True],
                 [{"level": 2}, {"level": 2}]) == [3.0, 0.0]
    finished_only = resolve_reward("wl_rewards:finished_only")
    assert score(finished_only, ["p", "p"], ["x", "y"], ["", ""], [True, False]) == [1.0, 0.0]
    assert resolve_reward("2*wl_rewards:by_level + exact-match")("p", "3", "3", {"level": 0}) == 3.0
    with pytest.raises(RewardError, match=r"is nan \(not finite\) for prompt 'What is 2\+2\?' and completion '5'"):
        score(resolve_reward("wl_rewards:nan"), ["What is 2+2?"], ["5"], ["4"], [True], [{}])
    with pytest.raises(RewardError, match=r"raised KeyError: 'level' for prompt 'p' and completion 'c'"):
        score(resolve_reward("wl_rewards:boom"), ["p"], ["c"], ["a"], [True], [{}])
    t0 = time.monotonic()
    with pytest.raises(RewardError, match=r"took more than 0.5 s \(task.rewardTimeout\) on prompt 'p' and completion "
                       r"'slow'"):
        score(resolve_reward("wl_rewards:slow", timeout_s=0.5), ["p"], ["slow"], ["a"], [True], [{}])
    assert time.monotonic() - t0 < 5
    with pytest.raises(ValueError, match="takes 2 positional parameters; define fn\\(prompt, completion, answer, "
                       "extra\\)"):
        resolve_reward("wl_rewards:two")
    for name in ("wl_rewards",):
        sys.modules.pop(name, None)


def test_validate_checks_rows_and_reward_before_anything_starts(tmp_path, monkeypatch):
    f = write_jsonl(tmp_path / "q.jsonl", [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": 4}])
    ok = spec({"dataset": str(f)})
    assert check_workload(ok) == []
    (err,) = check_workload(spec({"dataset": str(f), "reward": "no_such_pkg_xyz.rewards:score"}))
    assert err.path == "spec.task.reward" and "cannot be imported" in str(err) and "PYTHONPATH" in str(err)
    (tmp_path / "inf_reward.py").write_text("def score(prompt, completion, answer, extra):\n    return float('inf')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (err,) = check_workload(spec({"dataset": str(f), "reward": "inf_reward:score"}))
    assert "fails on the first rows" in str(err) and "is inf (not finite) for prompt '" in str(err)
    sys.modules.pop("inf_reward", None)


def test_rlscale_validate_names_the_row_and_field(tmp_path):
    """The CLI end to end: a relative dataset path is read from the spec's folder; a bad row fails it."""
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "q.jsonl", [{"prompt": "1+1=", "answer": "2"}] * 3 + [{"prompt": "2+2=", "answr": "4"}])
    doc = rlrun_dict({"hardware": {"accelerator": "cpu"}, "task": {"dataset": "data/q.jsonl"}}, name="byo")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(doc))
    out = rlscale_cli("validate", str(tmp_path / "run.yaml"))
    assert out.returncode == 1, out.stdout + out.stderr
    said = " ".join(out.stderr.split())
    assert f"spec.task.dataset: '{data / 'q.jsonl'}' train row 4: field 'answer' is missing" in said


def test_validate_leaves_a_plugin_shipped_in_the_plugin_volume_to_the_pods(tmp_path):
    """A cluster spec whose plug-in comes in task.pluginVolume validates here (the rows are still
    read) and says the plug-in is tried when the run starts; without the volume it is refused."""
    write_jsonl(tmp_path / "q.jsonl", [{"prompt": "1+1=", "answer": "2"}] * 4)
    task = {"dataset": "q.jsonl", "reward": "shipped_reward:score"}
    for name, extra in (("shipped", {"pluginVolume": {"configMap": {"name": "r"}}}), ("local", {})):
        doc = rlrun_dict({"hardware": {"accelerator": "cpu"}, "task": {**task, **extra}}, name=name)
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    out = rlscale_cli("validate", str(tmp_path / "shipped.yaml"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "comes from task.pluginVolume: it is tried when the run starts" in " ".join(out.stdout.split())
    # Without the volume the plug-in must import here (in-process: the same check validate runs).
    local = yaml.safe_load((tmp_path / "local.yaml").read_text())["spec"]
    local["task"]["dataset"] = str(tmp_path / "q.jsonl")
    (err,) = check_workload(parse_spec(local))
    assert err.path == "spec.task.reward" and "module 'shipped_reward' cannot be imported" in str(err)


def test_spec_refuses_what_the_code_cannot_run():
    def errors(task=None, target=None):
        with pytest.raises(SpecError) as info:
            parse_spec({"hardware": {"accelerator": "cpu"}, "task": task or {}, "target": target or {}})
        return str(info.value)

    assert "spec.task.name: 'gsm8k' is not a builtin task, and task.dataset is unset" in errors({"name": "gsm8k"})
    assert "spec.target.metric: 'eval/f1' is not allowed" in errors(target={"metric": "eval/f1"})
    assert "spec.task.reward: 'exact match' is not a reward expression" in errors({"reward": "exact match"})
    assert "spec.task.promptField" in errors({"dataset": "x.jsonl", "promptField": "q", "messagesField": "m"})
    assert "spec.task.chat: false turns the chat template off" in errors({"dataset": "x.jsonl", "messagesField": "m",
                                                                          "chat": False})
    assert "leave task.chat unset for auto" in errors({"chat": "auto"})
    weighted = parse_spec({"hardware": {"accelerator": "cpu"}, "task": {"reward": "0.9*math + 0.1*format"}})
    assert math.isclose(weighted.task.reward_timeout, 10.0)


def test_render_keeps_row_extras(char_tok):
    from rlscale.trainer.data import Row

    (p,), dropped = render([Row(1, "1+1=", None, "2", {"k": 1})], char_tok, spec({}).task, False, 100)
    assert dropped == 0 and p.extra == {"k": 1} and p.answer == "2"


# --------------------------------------------------------------------------- learning on a dataset


@pytest.mark.slow  # trains (DeepSpeed, a critic): about 45 s on 2 cores; `make unit` leaves it to `make test`
def test_ppo_on_a_dataset_task_with_a_plugin_reward(small_model, tmp_path):
    """PPO (critic and all) on a task read from a JSONL file, rewarded by a module:function
    plug-in that uses an extra field: the rewards come from real samples and the weights move."""
    import os

    (tmp_path / "sum_rewards.py").write_text(
        "def close(prompt, completion, answer, extra):\n"
        "    digits = ''.join(c for c in completion if c.isdigit())\n"
        "    return 1.0 if digits == answer else 0.2 * (extra['a'] % 2)\n")
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "a": a} for a in range(10, 40) for b in range(10, 20)]
    data = write_jsonl(tmp_path / "sums.jsonl", rows)
    args = {"model": str(small_model), "steps": 2, "spec": {
        "model": {"path": str(small_model), "dtype": "float32", "maxLength": 32},
        "algorithm": {"name": "ppo", "klCoef": 0.0},
        "task": {"dataset": str(data), "reward": "sum_rewards:close", "extraFields": ["a"], "maxNewTokens": 4,
                 "expectedPromptTokens": 7, "expectedResponseTokens": 3},
        "batch": {"prompts": 8, "samplesPerPrompt": 2, "microBatch": 8},
        "optimizer": {"lr": 1e-3}, "learner": {"zeroStage": 0, "gpusPerReplica": 0}, "rollout": {"gpusPerReplica": 0},
        "budget": {"gpus": 0}, "hardware": {"accelerator": "cpu"}}}
    (tmp_path / "args.json").write_text(json.dumps(args))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}
    worker = Path(__file__).with_name("dataset_worker.py")
    out = subprocess.run([sys.executable, str(worker), str(tmp_path / "args.json")],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    res = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert res["critic"] and res["train"] == 270 and res["eval"] == 30
    assert len(res["rewards"]) == 32 and set(res["rewards"]) <= {0.0, 0.2, 1.0}
    assert any(r > 0 for r in res["rewards"])  # the odd a's give 0.2 whatever is sampled: a real signal
    assert res["moved"] > 0
    assert any(s["value_loss"] > 0 for s in res["stats"]), res["stats"]  # the critic is trained
