"""`rlscale run` generating ahead of the learner (spec.algorithm.maxStaleness, pinned with --staleness):
real Ray, vLLM and DeepSpeed; the rollout and the learner on disjoint cores; Ctrl-C mid-run and the
same command again. The batches generated ahead go into the checkpoint, the resumed run trains them
first, and no batch trains more than the staleness versions after the weights that generated it.
The run scores with a reward model beside a verifier (task.rewardModel: a tiny sequence-classification
model built in the test, served by Ray Serve next to the driver), each term logged on its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import EXAMPLES, ROOT
from tests.e2e.test_embedded_run import no_strays, our_processes, records

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

K = 2  # steps ahead: with 2 the checkpoint at Ctrl-C holds up to two batches


def async_spec(tmp_path: Path) -> Path:
    from tests.trainer.test_reward_model import save_tiny_reward_model

    rm = save_tiny_reward_model(tmp_path / "rm")
    spec = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    spec["metadata"]["name"] = "ahead"
    s = spec["spec"]
    s["placement"] = "disaggregated"
    s["algorithm"].update(maxStaleness=K, isCap=2.0)  # stale batches weighted by min(pi_old / pi_behaviour, 2)
    s["target"].update(value=0.999, evalEvery=5)  # out of reach: the run ends at its step budget
    s["batch"].update(prompts=8)
    s["task"].update(reward="0.5*reward-model + 0.5*exact-match", rewardModel={"path": str(rm)})
    s["checkpoint"] = {"every": 5}
    s["budget"].update(maxSteps=14)
    f = tmp_path / "ahead.yaml"
    f.write_text(yaml.safe_dump(spec))
    return f


def start(spec: Path, runs: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rlscale.cli", "run", str(spec), "--runs-dir", str(runs), "--metrics-port", "0",
         "--staleness", str(K)],
        cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "100"}, stdout=open(log, "ab"),
        stderr=subprocess.STDOUT, start_new_session=True)


def newest_state(run_dir: Path) -> dict:
    ckpts = sorted(p for p in (run_dir / "checkpoints").glob("step-*") if (p / "run_state.json").exists())
    return json.loads((ckpts[-1] / "run_state.json").read_text())


def test_an_interrupted_run_generating_ahead_resumes_with_its_batches_and_keeps_the_bound(tmp_path):
    spec, runs, log = async_spec(tmp_path), tmp_path / "runs", tmp_path / "run.log"
    run_dir = runs / "ahead"
    proc = start(spec, runs, log)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and proc.poll() is None:
        recs = records(run_dir)
        if recs and recs[-1]["step"] >= 7:
            break
        time.sleep(0.5)
    assert proc.poll() is None, log.read_text()[-4000:]
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=180) == 130, log.read_text()[-4000:]
    assert no_strays(run_dir / "run.json"), our_processes(run_dir / "run.json")
    state = newest_state(run_dir)
    pending = state["run"]["pending"] if "run" in state else state["pending"]
    assert pending, "the checkpoint at Ctrl-C holds the batches generated ahead"
    assert all(state_version(state) - p["version"] <= K for p in pending)
    stopped_at = records(run_dir)[-1]["step"]

    proc = start(spec, runs, log)
    assert proc.wait(timeout=900) == 3, log.read_text()[-4000:]  # the step budget
    recs = records(run_dir)
    assert [r["step"] for r in recs] == list(range(1, 15)), "one unbroken history"
    assert all(0 <= r["staleness"] <= K for r in recs)
    assert max(r["staleness"] for r in recs) >= 1, [r["staleness"] for r in recs]  # it did generate ahead
    assert recs[-1]["stale_samples"] == 0  # nothing too old: nothing dropped
    weighted = [r for r in recs if not r["skipped"]]  # the engines' log-probs reached the learner's weights
    assert weighted and all(0 < r["is_weight_mean"] <= 2.0 for r in weighted), [r["is_weight_mean"] for r in recs]
    resumed = recs[stopped_at]  # the first step after the resume trained the oldest batch kept
    assert resumed["staleness"] == state_version(state) - pending[0]["version"]
    assert recs[-1]["samples"] == sum(r["batch_samples"] for r in recs)  # every sample counted once
    for r in recs:  # the weighted sum's mean, and each term's unweighted mean on its own
        terms = r["reward_terms"]
        assert set(terms) == {"reward-model", "exact-match"}, terms
        assert r["reward_mean"] == pytest.approx(0.5 * terms["reward-model"] + 0.5 * terms["exact-match"], abs=1e-3)
    learner_log = (run_dir / "logs" / "learner-0.log").read_text()
    assert f"{len(pending)} batches generated ahead" in learner_log
    config = json.loads((run_dir / "run.json").read_text())
    cores = config["local"]
    rollout, learner = set(cores["rollout_cpus"] or ()), set(cores["learner_cpus"] or ())
    assert rollout and learner and not rollout & learner
    # the step records say which split their phases ran on (the re-planner's calibration reads it)
    assert all(r["cores"] == {"rollout": len(rollout), "learner": len(learner)} for r in recs), recs[-1]["cores"]
    assert "cores: rollout" in log.read_text()


def state_version(state: dict) -> int:
    return int((state.get("run") or state)["version"])
