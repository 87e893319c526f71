"""The builtin model cache: two processes racing build it once and both get the finished model."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

# A recipe that stops after one eval (target accuracy 0), so the race is cheap.
RACER = textwrap.dedent("""
    import os, sys
    from rlscale.trainer import builtin
    real = builtin.warm_start
    def counted(*args, **kw):  # each build leaves a line: the test counts them
        with open(os.path.join(sys.argv[1], "builds.log"), "a") as f:
            f.write(f"{os.getpid()}\\n")
        return real(*args, **kw)
    builtin.warm_start = counted
    builtin.BUILTIN_MODELS["builtin:race-test"] = {
        "shape": {"hidden_size": 128, "num_layers": 1, "num_heads": 2, "head_dim": 64, "intermediate_size": 128},
        "task": "builtin:arithmetic", "lr": 1e-3, "batch": 16, "target_accuracy": 0.0, "eval_every": 2,
        "max_steps": 10, "seed": 0}
    print(builtin.ensure_builtin_model("builtin:race-test", cache_dir=sys.argv[1], progress=False))
""")


def test_two_processes_racing_build_the_model_once(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300)[0].strip().splitlines()[-1] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1]
    builds = (tmp_path / "builds.log").read_text().split()
    assert len(builds) == 1, f"built {len(builds)} times"
    from rlscale.trainer.builtin import RECIPE_VERSION

    name = f"race-test-v{RECIPE_VERSION}"
    info = json.loads((tmp_path / name / "rlscale-builtin.json").read_text())
    assert str(info["built_by_pid"]) == builds[0]
    # One finished directory, no temporary leftovers, loadable in HF format.
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [name]
    model = AutoModelForCausalLM.from_pretrained(outs[0])
    assert model.config.head_dim == 64
    assert len(AutoTokenizer.from_pretrained(outs[0])) == 17


def test_unknown_builtin_and_missing_directory_name_the_field(tmp_path):
    from rlscale.trainer.builtin import builtin_model_dir, resolve_model_path

    with pytest.raises(ValueError, match="spec.model.path: 'builtin:huge'"):
        builtin_model_dir("builtin:huge")
    with pytest.raises(ValueError, match="not a local model directory"):
        resolve_model_path(str(tmp_path / "nope"))
