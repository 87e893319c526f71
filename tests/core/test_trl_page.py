"""docs/trl-verl.md's wrapper: a TRL reward function, batched and keyword-driven, runs as a plug-in as written."""

from __future__ import annotations

import json
import re

import yaml

from tests.conftest import ROOT, rlrun_dict
from tests.conftest import rlscale_cli as cli

PAGE = ROOT / "docs" / "trl-verl.md"


def test_the_pages_wrapper_runs_a_trl_reward_function(tmp_path):
    (wrapper,) = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    # A TRL reward function: lists in, a list out, the dataset's columns as keyword lists.
    (tmp_path / "my_trl_rewards.py").write_text(
        "def reward_len(prompts, completions, topic, **kwargs):\n"
        "    assert len(prompts) == len(completions) == len(topic) == 1\n"
        "    return [1.0 if t == 'sums' else -abs(20 - len(c)) for c, t in zip(completions, topic)]\n")
    (tmp_path / "mymodule.py").write_text(wrapper)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"prompt": f"{a}+1=", "answer": a + 1, "topic": "sums"})
                                              + "\n" for a in range(12)))
    spec = {"model": {"path": "builtin:smollm2-135m-instruct", "dtype": "float32"}, "hardware": {"accelerator": "cpu"},
            "task": {"dataset": "d.jsonl", "reward": "mymodule:score"}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(rlrun_dict(spec)))
    # validate imports the plug-in and scores a few rows with it: the asserts above fail it unless the
    # wrapper hands each column over as a list of one.
    r = cli("validate", "s.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    broken = wrapper.replace("{k: [v] for k, v in extra.items()}", "extra")
    (tmp_path / "mymodule2.py").write_text(broken)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(rlrun_dict({**spec, "task": {**spec["task"],
                                                                                 "reward": "mymodule2:score"}})))
    r = cli("validate", "s.yaml", cwd=tmp_path)
    assert r.returncode == 1 and "mymodule2:score" in r.stderr, r.stdout + r.stderr
