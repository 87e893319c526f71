"""docs/trl-verl.md's reward functions: a TRL reward function, batched and keyword-driven, is a plug-in as it is;
the page's wrapper runs a verl `compute_score` as written."""

from __future__ import annotations

import json
import re

import yaml

from tests.conftest import ROOT, rlrun_dict
from tests.conftest import rlscale_cli as cli

PAGE = ROOT / "docs" / "trl-verl.md"
SPEC = {"model": {"path": "builtin:smollm2-135m-instruct", "dtype": "float32"}, "hardware": {"accelerator": "cpu"},
        "task": {"dataset": "d.jsonl"}}


def _write(tmp_path, reward: str) -> None:
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"prompt": f"{a}+1=", "answer": a + 1, "topic": "sums",
                                                          "data_source": "arith"}) + "\n" for a in range(12)))
    spec = {**SPEC, "task": {**SPEC["task"], "reward": reward}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(rlrun_dict(spec)))


def test_a_trl_reward_function_validates_as_it_is(tmp_path):
    # A TRL reward function: lists in, a list out, the dataset's columns as keyword lists; validate imports it
    # and scores the first rows with it in one call (the assert fails it unless every column is a list as long).
    (tmp_path / "my_trl_rewards.py").write_text(
        "def reward_len(prompts, completions, topic, **kwargs):\n"
        "    assert len(prompts) == len(completions) == len(topic) == len(kwargs['answer']) > 1\n"
        "    return [1.0 if t == 'sums' else -abs(20 - len(c)) for c, t in zip(completions, topic)]\n"
        "def short(completions, **kwargs):\n"
        "    return [1.0]\n")
    _write(tmp_path, "my_trl_rewards:reward_len")
    r = cli("validate", "s.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    _write(tmp_path, "my_trl_rewards:short")
    r = cli("validate", "s.yaml", cwd=tmp_path)
    assert r.returncode == 1 and "my_trl_rewards:short" in r.stderr and "returned 1 values" in r.stderr, r.stderr


def test_the_pages_wrapper_runs_a_verl_compute_score(tmp_path):
    (wrapper,) = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    (tmp_path / "my_verl_rewards.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    assert data_source == 'arith'\n"
        "    return 1.0 if solution_str.strip() == ground_truth else 0.0\n")
    (tmp_path / "mymodule.py").write_text(wrapper)
    _write(tmp_path, "mymodule:score")
    r = cli("validate", "s.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
