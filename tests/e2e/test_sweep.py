"""`rlscale sweep` end to end: 2 batches x 1 seed of the quickstart, a few steps each, real Ray, vLLM and DeepSpeed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import EXAMPLES, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_tiny_sweep_writes_a_report_that_parses(tmp_path: Path):
    spec = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    spec["metadata"]["name"] = "tiny"
    # Out of reach, so every run spends its whole budget whatever this machine's warm start reached.
    spec["spec"]["target"]["value"] = 0.99
    f = tmp_path / "tiny.yaml"
    f.write_text(yaml.safe_dump(spec))
    patch = tmp_path / "cal.yaml"
    # 1,536 samples: 24 steps of 8x8 and 12 of 16x8, evals every 512 samples (3 per run)
    cmd = [sys.executable, "-m", "rlscale.cli", "sweep", str(f), "--batches", "8,16", "--lr-rules", "sqrt",
           "--seeds", "1", "--samples", "1536", "--eval-samples", "512", "--runs-dir", str(tmp_path / "runs"),
           "--write-calibration", str(patch)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=800, env=dict(os.environ))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp_path / "runs" / "tiny-sweep"
    state = json.loads((out / "sweep.json").read_text())
    assert {n: i["status"] for n, i in state["runs"].items()} == {"tiny-p8-sqrt-s0": "done", "tiny-p16-sqrt-s0": "done"}
    assert all(i["startupSeconds"] > 0 for i in state["runs"].values())
    # The second run joined the first one's Ray nodes and used its vLLM replica (same process),
    # replacing the replica's weights with its own starting ones.
    said = {name: re.search(r"rollout app (\S+): (\w+).*replica pids \[(\d+)\]",
                            (out / "runs" / name / "logs" / "learner-0.log").read_text())
            for name in ("tiny-p8-sqrt-s0", "tiny-p16-sqrt-s0")}
    assert all(said.values()), said
    first, second = (said[n].groups() for n in ("tiny-p8-sqrt-s0", "tiny-p16-sqrt-s0"))
    assert first[:2] == ("rollout-tiny-sweep", "deployed") and second[:2] == ("rollout-tiny-sweep", "attached"), said
    assert first[2] == second[2], said
    assert not (out / "runs" / "tiny-p16-sqrt-s0" / "logs" / "ray-head.log").exists()
    for name, prompts, lr in (("tiny-p8-sqrt-s0", 8, 1e-4 / 2 ** 0.5), ("tiny-p16-sqrt-s0", 16, 1e-4)):
        recs = [json.loads(x) for x in (out / "runs" / name / "metrics.jsonl").read_text().splitlines() if x]
        assert recs[-1]["samples"] == 1536 and {r["prompts"] for r in recs} == {prompts}
        assert {round(r["lr"], 12) for r in recs} == {round(lr, 12)}  # re-planning off: the rule's lr throughout
        assert [r["samples"] for r in recs if r.get("eval") is not None] == [512, 1024, 1536]
        # vLLM's log-probs of the first step's samples are the learner's own (same weights): the
        # second run's replica generated with that run's starting weights, not the first run's last.
        assert recs[0]["logprob_abs_diff"] < 1e-3, (name, recs[0]["logprob_abs_diff"])
    md = (out / "sweep.md").read_text()
    assert "## Rule sqrt" in md and "(b) larger batches raise generation throughput" in md
    for png in ("curves.png", "throughput.png", "decision.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = yaml.safe_load(patch.read_text())
    assert data["kind"] == "RLRunCalibration" and data["calibration"]["phases"]["train"] > 0
    plan = subprocess.run([sys.executable, "-m", "rlscale.cli", "plan", str(f), "--calibration", str(patch),
                           "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["calibrated"] is True
    # a second call finds every run done and only rewrites the report
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    # rich wraps its lines at the console's width (80 columns without a terminal): compare words
    said = " ".join((again.stdout + again.stderr).split())
    assert again.returncode == 0 and "(2 already done)" in said, said[-2000:]
