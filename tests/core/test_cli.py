"""The CLI as a user runs it: exit codes, field-named errors, plan JSON keys."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import EXAMPLES, ROOT

RLSCALE = [sys.executable, "-m", "rlscale.cli"]


def cli(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(RLSCALE + list(args), capture_output=True, text=True, cwd=cwd, timeout=120)


def test_validate_examples_exit_0():
    r = cli("validate", *map(str, sorted(EXAMPLES.glob("*.yaml"))))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("ok ") == len(list(EXAMPLES.glob("*.yaml")))


@pytest.mark.parametrize(
    "body,needle",
    [
        ("spec:\n  batch: {prompts: 0}\n", "spec.batch.prompts: 0 is not allowed"),
        ("spec:\n  batch: {samplesPerPrompt: 1}\n", "spec.batch.samplesPerPrompt: 1 is too small for GRPO"),
        ("spec:\n  optimizer: {lr: -0.1}\n", "spec.optimizer.lr: -0.1 must be greater than 0"),
        ("spec:\n  learner: {zeroStage: 5}\n", "spec.learner.zeroStage: 5"),
        ("spec:\n  budget: {gpus: 1}\n", "spec.budget.gpus: 1 does not cover"),
        ("spec:\n  batch: {prompt: 4}\n", "did you mean 'prompts'"),
    ],
)
def test_validate_bad_spec_exit_1_naming_the_field(tmp_path, body, needle):
    f = tmp_path / "bad.yaml"
    f.write_text("apiVersion: rlscale.dev/v1alpha1\nkind: RLRun\nmetadata: {name: bad}\n" + body)
    r = cli("validate", str(f))
    assert r.returncode == 1
    assert needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("text", ["", ": : :\n", "kind: Deployment\n"])
def test_garbage_is_one_line_no_traceback(tmp_path, text):
    f = tmp_path / "g.yaml"
    f.write_text(text)
    r = cli("validate", str(f))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert len([line for line in r.stderr.splitlines() if line.strip()]) <= 2


def test_plan_json_keys():
    r = cli("plan", str(EXAMPLES / "grpo-h100.yaml"), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for key in ("prompts", "samplesPerPrompt", "learningRate", "rolloutReplicas", "learnerReplicas", "reason"):
        assert key in d, key
    for key in ("samplesPerSecond", "stepSeconds", "timeToTargetSeconds"):
        assert d["predicted"][key] > 0, key
    assert d["rolloutReplicas"] + d["learnerReplicas"] <= 16
    assert 16 <= d["prompts"] <= 512


def test_plan_table_explains_itself():
    r = cli("plan", str(EXAMPLES / "quickstart.yaml"))
    assert r.returncode == 0, r.stderr
    assert "why" in r.stdout and "Candidates" in r.stdout


def test_crd_command_prints_the_committed_crd():
    r = cli("crd")
    assert r.returncode == 0
    assert r.stdout == (ROOT / "charts/rlscale/crds/rlruns.rlscale.dev.yaml").read_text()


def test_core_imports_no_heavy_packages():
    code = ("import sys, rlscale.cli, rlscale.spec, rlscale.plan, rlscale.crd, rlscale.embedded, rlscale.report, rlscale.run_metrics;"
            "bad = [m for m in ('torch', 'ray', 'vllm', 'deepspeed', 'transformers', 'kopf') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
