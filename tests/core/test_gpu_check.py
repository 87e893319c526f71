"""bench/gpu_check.py (`make gpu-check`) on a machine without a GPU: the early exit, the measuring code
on a tiny CPU model (--cpu-smoke), the planner columns and the fallback import of the planner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.py"
sys.path.insert(0, str(SCRIPT.parent))

import gpu_check  # noqa: E402  (bench/ is not a package)

HAS_GPU = any(n.startswith("nvidia") and n[6:].isdigit() for n in os.listdir("/dev"))


def _run(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, **(env or {})})


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_and_exits_0(tmp_path):
    proc = _run(env={"OUT": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "gpu-check: no GPU here" in proc.stdout and "nothing measured" in proc.stdout
    assert list(tmp_path.iterdir()) == []  # no report pretending to be one


def test_cpu_smoke_measures_decode_and_a_learner_step_beside_the_planner(tmp_path):
    proc = _run("--cpu-smoke", env={"OUT": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    decode = data["decode"]
    assert [r["concurrency"] for r in decode] == [1, 2]
    for r in decode:
        assert "skipped" not in r, (r, proc.stderr[-2000:])
        assert r["tokens_per_s"] > 0 and r["step_ms"] > 0
        assert r["planner_tps"] > 0 and r["roofline_tps"] >= r["planner_tps"]
    learner = data["learner"]
    assert [r["gradient_checkpointing"] for r in learner] == [False, True]
    for r in learner:
        assert r["tokens_per_s"] > 0 and r["tokens"] == 2 * 32 and r["params"] > 0
        assert r["planner_tokens_per_s"] > 0 and r["planner_gb"] > 0
    # the planner charges gradient checkpointing a recomputed forward
    assert learner[1]["planner_step_s"] > learner[0]["planner_step_s"]
    md = (tmp_path / "gpu_check.md").read_text()
    assert "| tiny | 1 |" in md and "| tiny | yes |" in md and "## Learner step" in md
    assert md in proc.stdout  # the same table on stdout


def test_roofline_and_planner_decode_for_7b_on_h200():
    planner, note = gpu_check.import_planner()
    assert planner is not None, note
    shape = gpu_check.planner_shape(planner, "qwen2.5-7b", gpu_check.QWEN25["qwen2.5-7b"])
    assert 7.5e9 < shape.params < 7.7e9  # published: 7,615,616,512
    h200 = planner.profiles.PROFILES["H200"]
    roof1, plan1 = gpu_check.decode_predictions(planner, shape, h200, "bfloat16", 1, 100)
    # b=1 reads the 15 GB of weights once per token: ~300 tokens/s at 4.8 TB/s
    assert 250 < roof1 < 350 and plan1 < roof1
    roof256, plan256 = gpu_check.decode_predictions(planner, shape, h200, "bfloat16", 256, 100)
    assert roof256 > 100 * roof1 and plan256 > 50 * plan1  # memory-bound: batching is nearly free


def test_planner_loads_under_a_stub_when_the_package_init_cannot_import():
    # rlscale.plan's __init__ imports the whole planner; the three modules the check needs are stdlib-only
    code = ("import sys; sys.modules['rlscale.plan.decision'] = None; sys.path.insert(0, 'bench'); import gpu_check; "
            "p, note = gpu_check.import_planner(); "
            "print('OK', p.throughput.decode_step_seconds(1, 1e9, 0, 0, 1e9, 1e12, 1e6) > 0, note)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("OK True") and "without its package" in proc.stdout


def test_report_marks_skipped_rows_and_missing_planner_columns():
    s = gpu_check.settings(gpu_check.parse_args(["--cpu-smoke"]))
    env = {"device_name": "X", "torch": "t", "transformers": "tf", "cuda": None, "python": "3", "preflight": "pf"}
    decode = [{"model": "tiny", "concurrency": 1, "step_ms": 2.0, "tokens_per_s": 500.0, "context": 9.0,
               "peak_gb": None},
              {"model": "tiny", "concurrency": 2, "skipped": "time budget"}]
    learner = [{"model": "tiny", "gradient_checkpointing": True, "skipped": "out of memory: x"}]
    text = gpu_check.report(s, env, decode, learner, ["planner columns left out: cannot import"])
    assert "| tiny | 1 | 2.00 | 500 | - | - | - | - |" in text
    assert "| tiny | 2 | skipped: time budget |" in text
    assert "| tiny | yes | skipped: out of memory: x |" in text
    assert "- planner columns left out" in text
