"""The CLI as a user runs it: exit codes, field-named errors, plan JSON keys."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import EXAMPLES, ROOT
from tests.conftest import rlscale_cli as cli

RLSCALE = [sys.executable, "-m", "rlscale.cli"]


def cli_process(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    """The CLI as a user starts it: its own interpreter, through `python -m rlscale.cli`."""
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
        ("spec:\n  budget: {gpus: 1}\n  placement: disaggregated\n", "spec.budget.gpus: 1 does not cover"),
        ("spec:\n  budget: {gpus: 1}\n  learner: {replicas: 2}\n", "spec.budget.gpus: 1 does not cover the learner"),
        ("spec:\n  learner: {gpusPerReplica: 8, ranksPerReplica: 4}\n", "spec.learner.ranksPerReplica: 4 differs"),
        ("spec:\n  placement: colocated\n  rollout: {replicas: 2}\n", "spec.rollout.replicas: 2 is set with placement"),
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
    # What is assumed rather than measured is in the table, not only in --json.
    r = cli("plan", str(EXAMPLES / "grpo-h100.yaml"))
    assert "placeholder" in r.stdout and "not measured" in r.stdout, r.stdout


def test_help_lists_the_user_commands_not_the_pod_entrypoints():
    r = cli("--help")
    assert r.returncode == 0, r.stderr
    listed = {line.split()[1] for line in r.stdout.splitlines() if line.startswith("│ ") and len(line.split()) > 2}
    assert {"validate", "plan", "crd", "run"} <= listed
    assert not listed & {"ray-head", "rollout", "learner", "prepare-model", "operator"}


def test_validate_names_the_file_once_and_shows_yaml_values(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: {batch: [1}\n")
    r = cli("validate", str(broken))
    assert r.returncode == 1 and r.stderr.count(str(broken)) == 1, r.stderr
    f = tmp_path / "bool.yaml"
    f.write_text("apiVersion: rlscale.dev/v1alpha1\nkind: RLRun\nmetadata: {name: b}\nspec:\n  rollout: "
                 "{replicas: true}\n")
    r = cli("validate", str(f))
    assert "spec.rollout.replicas: true is not allowed" in r.stderr, r.stderr


def test_validate_says_a_placement_profile_is_the_clusters_to_check(tmp_path):
    f = tmp_path / "profiled.yaml"
    f.write_text("apiVersion: rlscale.dev/v1alpha1\nkind: RLRun\nmetadata: {name: p}\nspec:\n"
                 "  hardware: {accelerator: cpu}\n  scheduling: {placementProfile: h100}\n")
    r = cli("validate", str(f))
    assert r.returncode == 0, r.stderr
    assert "spec.scheduling.placementProfile 'h100': syntax checked only" in r.stdout
    assert "policy.placementProfiles" in r.stdout
    f.write_text(f.read_text().replace("h100", "H100"))
    r = cli("validate", str(f))
    assert r.returncode == 1 and "spec.scheduling.placementProfile" in r.stderr, r.stderr


def test_run_refuses_a_plan_error_in_one_line(tmp_path):
    # Fits the schema, but the planner cannot size a model directory without config.json.
    (tmp_path / "empty-model").mkdir()
    f = tmp_path / "noshape.yaml"
    f.write_text("apiVersion: rlscale.dev/v1alpha1\nkind: RLRun\nmetadata: {name: noshape}\nspec:\n"
                 f"  model: {{path: {tmp_path / 'empty-model'}}}\n  hardware: {{accelerator: cpu}}\n")
    planned = cli("plan", str(f))
    assert planned.returncode == 1 and "spec.model.shape" in planned.stderr  # so `run` stops before any process
    r = cli_process("run", str(f), "--runs-dir", str(tmp_path / "runs"))
    assert r.returncode == 1 and "spec.model.shape" in r.stderr, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_sweep_refuses_colocated_engines_naming_the_placement(tmp_path):
    from typer.testing import CliRunner

    from rlscale.cli import app

    spec = tmp_path / "run.yaml"
    spec.write_text("apiVersion: rlscale.dev/v1alpha1\nkind: RLRun\nmetadata: {name: co}\n"
                    "spec:\n  hardware: {accelerator: cpu}\n  placement: colocated\n"
                    "  budget: {gpus: 0}\n  rollout: {gpusPerReplica: 0}\n  learner: {gpusPerReplica: 0}\n")
    out = CliRunner().invoke(app, ["sweep", str(spec), "--runs-dir", str(tmp_path / "runs"), "--batches", "8"])
    assert out.exit_code == 1
    assert "spec.placement: colocated" in out.output and "disaggregated" in out.output
    assert not (tmp_path / "runs" / "co-sweep" / "nodes").exists()
