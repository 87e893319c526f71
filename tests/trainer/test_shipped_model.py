"""The shipped build of `builtin:tiny-arith`: it is the current recipe's, it installs into the
cache intact (replacing a machine's own build of the same recipe), and the installed model
scores what its build record says on the held-out prompts."""

from __future__ import annotations

import json

import pytest

from rlscale.trainer import builtin

NAME = "builtin:tiny-arith"


def test_the_shipped_build_is_the_current_recipes():
    shipped = builtin.shipped_build(NAME)
    assert shipped is not None, (
        "trainer/weights holds no build of the current tiny-arith recipe: after a recipe change run "
        "`.venv/bin/python hack/ship-builtin.py` and commit trainer/weights/")
    record = json.loads((shipped / builtin.SHIPPED_RECORD).read_text())
    assert builtin.sha256_file(shipped / "model.safetensors") == record["sha256"]
    assert record["accuracy"] >= builtin.TINY_ARITH["target_accuracy"]


@pytest.mark.slow  # the held-out eval: 11 s on 2 cores
def test_the_tool_model_ships_so_no_pod_runs_its_7_minute_recipe(tmp_path):
    """builtin:tiny-tools ships like tiny-arith: the images carry it (trainer/ is copied in), and a pod's
    prepare-model installs it in a second instead of warm-starting it per run."""
    shipped = builtin.shipped_build("builtin:tiny-tools")
    assert shipped is not None, ("trainer/weights holds no build of the current tiny-tools recipe: run "
                                 "`.venv/bin/python hack/ship-builtin.py --name builtin:tiny-tools` and commit it")
    record = json.loads((shipped / builtin.SHIPPED_RECORD).read_text())
    assert record["forced_call_accuracy"] >= builtin.TINY_TOOLS["target_accuracy"]
    path = builtin.ensure_builtin_model("builtin:tiny-tools", cache_dir=tmp_path, progress=False)
    marker = json.loads((path / builtin.MARKER).read_text())
    assert marker["sha256"] == record["sha256"] and marker["source"].startswith("shipped")
    assert "shipped" in next(x for x in builtin.check_sources() if x.startswith("builtin:tiny-tools"))


@pytest.mark.slow  # installs and scores the shipped model (seconds): `make test`, not `make unit`
def test_install_replaces_an_unshipped_build_and_scores_as_recorded(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlscale.trainer.data import load_task
    from rlscale.trainer.generation import accuracy

    # A machine's own earlier build of the recipe: finished, but not the shipped one.
    own = builtin.builtin_model_dir(NAME, cache_dir=tmp_path)
    own.mkdir(parents=True)
    (own / builtin.MARKER).write_text(json.dumps({"name": NAME, "accuracy": 0.5}))
    path = builtin.ensure_builtin_model(NAME, cache_dir=tmp_path, progress=False)
    assert path == own
    marker = json.loads((path / builtin.MARKER).read_text())
    record = json.loads((builtin.shipped_build(NAME) / builtin.SHIPPED_RECORD).read_text())
    assert marker["sha256"] == record["sha256"] and marker["source"].startswith("shipped")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([own.name, f".{own.name}.lock"])
    # Installed once: a second call finds it.
    mtime = (path / builtin.MARKER).stat().st_mtime_ns
    assert builtin.ensure_builtin_model(NAME, cache_dir=tmp_path, progress=False) == path
    assert (path / builtin.MARKER).stat().st_mtime_ns == mtime

    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    task = load_task(builtin.TINY_ARITH["task"], seed=builtin.TINY_ARITH["seed"])
    acc = accuracy(model, tok, task.eval, max_new_tokens=4)
    # Greedy decoding of the same weights; another CPU's float arithmetic may flip a near-tie or two.
    assert acc == pytest.approx(record["accuracy"], abs=0.01)


def test_a_damaged_shipped_file_is_refused(tmp_path):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\n")
    (shipped / builtin.SHIPPED_RECORD).write_text(json.dumps({"sha256": "0" * 64}))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(RuntimeError, match="the package is damaged"):
        builtin.install_shipped(out, shipped, "builtin:tiny-arith")
