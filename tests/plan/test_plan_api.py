"""The planner's public surface: names, JSON keys, summary, and the import boundary."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlscale.plan import Plan, PlanError, make_plan
from rlscale.spec import load_rlrun


def test_to_dict_keys(root):
    p = make_plan(load_rlrun(root / "examples" / "grpo-h100.yaml").spec)
    d = json.loads(json.dumps(p.to_dict()))
    for key in ("prompts", "samplesPerPrompt", "learningRate", "rolloutReplicas", "learnerReplicas",
                "reason", "candidates", "noiseScale", "calibrated"):
        assert key in d
    pred = d["predicted"]
    for key in ("samplesPerSecond", "stepSeconds", "timeToTargetSeconds", "samplesToTarget"):
        assert pred[key] > 0
    assert set(pred["phases"]) == {"generate", "reward", "train", "sync"}
    assert pred["stepSeconds"] == sum(pred["phases"].values())
    # time to target: the steps to target, each with its share of the held-out evals
    steps = pred["samplesToTarget"] / (d["prompts"] * d["samplesPerPrompt"])
    assert pred["evalSecondsPerStep"] > 0
    assert pred["timeToTargetSeconds"] == pytest.approx(steps * (pred["stepSeconds"] + pred["evalSecondsPerStep"]))
    assert d["candidates"][0]["prompts"] == d["prompts"]
    assert d["batch"] == f"{d['prompts']}x{d['samplesPerPrompt']}"


def test_summary_and_batch(root):
    p = make_plan(load_rlrun(root / "examples" / "quickstart.yaml").spec)
    assert isinstance(p, Plan)
    assert p.batch == p.prompts * p.samples_per_prompt
    assert p.summary() == f"{p.prompts}x{p.samples_per_prompt} lr={p.learning_rate:.2e} rollout=1 learner=1"


def test_every_example_plans(root):
    for f in sorted((root / "examples").glob("*.yaml")):
        p = make_plan(load_rlrun(f).spec)
        assert p.reason.endswith(".")
        assert p.predicted.time_to_target_seconds > 0


def test_plan_error_is_a_value_error():
    assert issubclass(PlanError, ValueError)


def test_planner_imports_no_heavy_framework():
    code = ("import sys, rlscale.plan; heavy = {'torch', 'ray', 'vllm', 'deepspeed', 'transformers', 'kopf'}; "
            "print(sorted(heavy & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
