"""`rlscale run` end to end: real Ray, vLLM, DeepSpeed and Prometheus; interrupt, resume, reach a target."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from rlscale.metrics_names import DIAGNOSTIC_KEYS, DIAGNOSTICS
from tests.conftest import EXAMPLES, ROOT
from tests.e2e.conftest import Prometheus, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


def start_target() -> float:
    """A small target above where this machine's builtin model begins.

    The warm start stops at the first eval (every 25 steps) at or above its target accuracy;
    the shipped build of version 2 (target 0.6) stopped at 0.724. Near 0.8 GRPO is
    slow: from 0.724 the 32x8 runs took 10-15k samples to 0.77 and 30-46k to 0.8, so +0.10
    would not be reached within the test's 400 steps of 16x8, while +0.05 took 120 (0.724 ->
    0.77 at 15,360 samples, this test on that machine). The test proves the mechanism (Ctrl-C,
    resume, a target reached and scraped), not a level (tests/trainer/test_grpo_learns.py does),
    so +0.01: the 8x8 run of `rlscale sweep examples/quickstart.yaml` (quickstart-p8-sqrt-s0)
    held 0.73 and 0.744 at 2,048 and 4,096 samples; this test at +0.05 ended at step 120 in 330 s, at
    +0.02 at step 70 in 226 s (`pytest tests/e2e/test_embedded_run.py -k interrupt --durations=0`,
    one after the other on a 2-core machine), and at +0.01 (0.734) at step 40 in 171 s (the same
    command; the evals at steps 10-40 were those of a +0.02 run on that machine, which then needed
    30 steps more). With evals every 10 steps (window 2) the run
    cannot end before step 20, after the test has interrupted it at step 13, whatever the eval
    noise (sd 0.024) does."""
    from rlscale.trainer.builtin import ensure_builtin_model

    info = json.loads((ensure_builtin_model("builtin:tiny-arith") / "rlscale-builtin.json").read_text())
    return max(0.48, round(float(info["accuracy"]) + 0.01, 3))


def small_run(tmp_path: Path, target: float) -> Path:
    spec = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    spec["metadata"]["name"] = "e2e"
    s = spec["spec"]
    s["target"].update(value=target, evalEvery=10, window=2)
    s["batch"].update(prompts=16)
    s["checkpoint"] = {"every": 10}
    s["budget"].update(maxSteps=400)
    s["logging"] = {"tensorboard": True, "mlflow": True, "project": "e2e"}  # the trackers, beside the report
    # Colocated: the engine in a Serve replica on the learner's Ray node, no rollout process (the
    # other local runs, and the real node's, are disaggregated).
    s["placement"] = "colocated"
    s["rollout"]["replicas"] = "auto"
    f = tmp_path / "e2e.yaml"
    f.write_text(yaml.safe_dump(spec))
    return f


def records(run_dir: Path) -> list[dict]:
    p = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []


def our_processes(run_json: Path) -> list[psutil.Process]:
    left = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("RLSCALE_CONFIG") == str(run_json):
                left.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return left


def no_strays(run_json: Path, within: float = 30.0) -> bool:
    """Every process of the run gone (exits are asynchronous: give them a moment)."""
    deadline = time.monotonic() + within
    while our_processes(run_json):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def start_run(spec: Path, runs: Path, port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "100"}
    return subprocess.Popen(
        [sys.executable, "-m", "rlscale.cli", "run", str(spec), "--runs-dir", str(runs), "--metrics-port", str(port),
         "--linger", "4"],
        cwd=ROOT, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
    )


def trackers_hold(run_dir: Path, recs: list[dict], steps: list[int]) -> None:
    """spec.logging's TensorBoard event files and MLflow file store, read back with their own readers."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    tb = {e.step: e.value for e in acc.Scalars("reward/exact-match")}
    assert sorted(tb) == steps and tb[steps[-1]] == pytest.approx(recs[-1]["reward_mean"])
    assert {"reward_mean", "samples_per_second", "phases/generate"} <= set(acc.Tags()["scalars"])
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    assert run.info.run_name == "e2e" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "reward_mean")
    assert {m.step for m in history} == set(steps)  # the resumed segment logs into the same MLflow run
    assert run.data.params["spec.task.reward"] == "exact-match"


def test_interrupt_resume_and_reach_target_scraped_by_prometheus(tmp_path):
    target = start_target()
    spec = small_run(tmp_path, target)
    runs = tmp_path / "runs"
    run_dir = runs / "e2e"
    port = free_port()
    log = tmp_path / "run.log"
    prom = Prometheus(tmp_path, [f"127.0.0.1:{port}"])
    try:
        # 1. start, let it pass a checkpoint, then Ctrl-C
        proc = start_run(spec, runs, port, log)
        # A cold machine first installs the builtin model (the recipe's minutes on 2 cores only
        # when trainer/weights holds no build of the current recipe).
        deadline = time.monotonic() + 1500
        while time.monotonic() < deadline and proc.poll() is None:
            recs = records(run_dir)
            if recs and recs[-1]["step"] >= 13:
                break
            time.sleep(0.25)  # a step takes 0.7-0.8 s here (run.log's "last step"): Ctrl-C soon after step 13
        assert proc.poll() is None, log.read_text()[-4000:]
        assert records(run_dir), log.read_text()[-4000:]
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=180) == 130, log.read_text()[-4000:]
        steps_before = records(run_dir)[-1]["step"]
        ckpts = sorted((run_dir / "checkpoints").iterdir())
        assert ckpts, "no checkpoint written on Ctrl-C"
        assert no_strays(run_dir / "run.json"), f"stray processes after Ctrl-C: {our_processes(run_dir / 'run.json')}"

        # 2. the same command resumes, losing at most one checkpoint interval
        proc = start_run(spec, runs, port, log)
        assert proc.wait(timeout=900) == 0, log.read_text()[-4000:]
        recs = records(run_dir)
        steps = [r["step"] for r in recs]
        assert steps == list(range(1, steps[-1] + 1)), "the log is one unbroken history"
        assert steps[-1] > steps_before
        # Every trained step says why it learns or not (vLLM returns log-probs, ZeRO 0 a gradient norm).
        trained = [r for r in recs if not r["skipped"]]
        assert trained and all(r[k] is not None for r in trained for k in DIAGNOSTIC_KEYS), trained[-1]
        assert all(0 < r["mixed_group_fraction"] <= 1 and r["grad_norm"] > 0 and r["entropy"] > 0 for r in trained)
        assert recs[-1]["time_to_target_seconds"] > 0 and recs[-1]["samples_to_target"] > 0
        assert recs[-1]["target_metric"] >= target
        assert "resumed from step" in (run_dir / "logs" / "learner-0.log").read_text()
        assert "time to target" in log.read_text().lower()
        assert no_strays(run_dir / "run.json"), f"stray processes after the run: {our_processes(run_dir / 'run.json')}"

        # 3. Prometheus scraped the driver's endpoint: read time-to-target back through its API
        result = prom.query("max_over_time(rlscale_time_to_target_seconds[10m])")
        assert result and float(result[0]["value"][1]) == pytest.approx(recs[-1]["time_to_target_seconds"], rel=1e-6)
        # the run is over, so its series are stale now: ask over the window it was up
        steps_seen = prom.query("max_over_time(rlscale_steps_total[10m])")
        assert steps_seen and float(steps_seen[0]["value"][1]) == recs[-1]["step"]
        for name in DIAGNOSTICS.values():
            assert prom.query(f"max_over_time({name}[10m])"), name
    finally:
        prom.stop()

    # 4. the report
    for name in ("metrics.jsonl", "plan.json", "curves.png", "diagnostics.png", "summary.md"):
        assert (run_dir / name).exists(), name
    # colocated: planned so, and no rollout process was started (the learner's Ray node hosted the engine)
    assert json.loads((run_dir / "run.json").read_text())["plan"]["placement"] == "colocated"
    assert not list((run_dir / "logs").glob("rollout-*.log")), sorted(p.name for p in (run_dir / "logs").iterdir())
    assert "## Diagnostics" in (run_dir / "summary.md").read_text()
    assert "time to target" in (run_dir / "summary.md").read_text()
    assert (run_dir / "curves.png").read_bytes()[:4] == b"\x89PNG"
    # each term of the reward on its own (one term here: exact-match, unweighted, so the batch's mean)
    assert recs[-1]["reward_terms"]["exact-match"] == pytest.approx(recs[-1]["reward_mean"])
    assert "reward term exact-match" in (run_dir / "summary.md").read_text()

    # 5. the trackers hold the step metrics of both segments, at the optimiser step
    trackers_hold(run_dir, recs, steps)


def test_a_dataset_that_fails_its_check_stops_the_run_with_the_field_and_leaves_nothing(tmp_path):
    """The task's checks run while the Ray nodes start: a bad row ends the run with its one-line
    error (naming the field, the file and the row), no learner starts, and the nodes are gone."""
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n')
    spec = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    spec["metadata"]["name"] = "badrows"
    task = spec["spec"]["task"]
    for k in ("name", "difficulty"):
        task.pop(k, None)
    task["dataset"] = str(broken)
    f = tmp_path / "badrows.yaml"
    f.write_text(yaml.safe_dump(spec))
    runs = tmp_path / "runs"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "rlscale.cli", "run", str(f), "--runs-dir", str(runs)],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "spec.task.dataset" in out and "row 2: field 'answer' is missing" in out and "Traceback" not in out, out
    assert not (runs / "badrows" / "logs" / "learner-0.log").exists()
    assert no_strays(runs / "badrows" / "run.json", within=5.0)
    print(f"refused in {time.monotonic() - t0:.1f} s")
