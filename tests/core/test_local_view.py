"""What `rlscale run` prints: the bar from the start score, lines of their own off a terminal, summary.md as
written, the next commands, a finished run left alone, and a metrics port claimed before anything starts."""

from __future__ import annotations

import io
import json
import os
import socket
import time
from pathlib import Path

import pytest
from rich.console import Console

from rlscale import local_view
from rlscale.embedded import run_embedded
from rlscale.local_ports import claim_metrics_port
from rlscale.records import StepRecord
from rlscale.report import write_report
from rlscale.roles import RunEnd, free_port
from rlscale.spec import load_rlrun
from tests.conftest import EXAMPLES

QUICKSTART = EXAMPLES / "quickstart.yaml"


def records(n: int = 8, reached_at: int | None = None) -> list[dict]:
    """A quickstart-like log: starts at 0.724, an eval every 2 steps climbing by 0.01."""
    out = []
    for i in range(1, n + 1):
        ev = 0.724 + 0.01 * i if i % 2 == 0 else None
        done = reached_at is not None and i >= reached_at
        out.append({"step": i, "samples": 256 * i, "wall_seconds": 0.7 * i, "prompts": 32, "samples_per_prompt": 8,
                    "step_seconds": 0.7, "samples_per_second": 365.0, "reward_mean": 0.7, "eval": ev,
                    "target_metric": ev, "eval_at_start": {"eval/accuracy": 0.724} if i == 1 else None,
                    "time_to_target_seconds": 0.7 * reached_at if done else None,
                    "samples_to_target": 256 * reached_at if done else None})
    return out


def write_run(run_dir: Path, recs: list[dict]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_report(run_dir, 0.8, "eval/accuracy", run_dir.name)


@pytest.fixture
def shown(monkeypatch):
    """local_view's console, writing to a buffer as a pipe would (not a terminal)."""
    buf = io.StringIO()
    monkeypatch.setattr(local_view, "console", Console(file=buf, width=200, force_terminal=False))
    return buf


def test_the_bar_runs_from_the_start_score_to_the_target():
    bar = local_view.TargetBar("eval/accuracy", 0.8, Console(file=io.StringIO()))
    recs = [StepRecord.from_dict(d) for d in records(4)]
    bar.see(recs[0])  # step 1 carries the score before training
    task = bar.bar.tasks[0]
    assert task.description == "eval/accuracy 0.724 -> 0.8" and task.percentage == 0
    bar.see(recs[3])  # moving average 0.764: 40 of the 76 thousandths to go
    assert task.percentage == pytest.approx(100 * 0.040 / 0.076, abs=0.01)
    bar.see(StepRecord.from_dict({**records(4)[3], "target_metric": 0.7}))  # below the start: empty, not negative
    assert task.percentage == 0


def test_off_a_terminal_each_eval_is_a_line_and_the_end_its_own():
    buf = io.StringIO()
    out = Console(file=buf, width=200, force_terminal=False)
    recs = [StepRecord.from_dict(d) for d in records(6)]
    with local_view.RunView(out, lambda rec: f"view at step {rec.step if rec else '-'}",
                            lambda rec: local_view.progress_line(rec, 0.8, "eval/accuracy")) as view:
        view.update(recs[2], recs[:3])
        view.update(recs[5], recs[3:])
    out.print("target reached — report: runs/x/summary.md")
    lines = buf.getvalue().splitlines()
    assert [ln.split("  ")[0] for ln in lines[:3]] == ["step 2", "step 4", "step 6"]  # one line per eval
    assert "eval/accuracy 0.744 (moving average 0.744 of 0.8)" in lines[0]
    assert lines[3:] == ["view at step 6", "target reached — report: runs/x/summary.md"]


@pytest.mark.slow  # seconds of subprocesses or models: `make test`, not `make unit`
def test_the_summary_is_printed_as_written_with_the_next_commands(tmp_path, shown):
    run_dir = tmp_path / "runs" / "quickstart"
    write_run(run_dir, records(8, reached_at=8))
    summary = (run_dir / "summary.md").read_text()
    assert summary.index("![curves](curves.png)") < summary.index("time to target")  # the curves first
    with open(run_dir / "summary.md", "a") as f:
        f.write("a [bold]bracket[/bold] stays\n")
    spec = load_rlrun(QUICKSTART).spec
    local_view.print_end(int(RunEnd.TARGET), run_dir, spec, QUICKSTART)
    text = shown.getvalue()
    assert "![diagnostics](diagnostics.png)" in text and "a [bold]bracket[/bold] stays" in text
    nxt = text.split("next:", 1)[1]
    assert f"run {QUICKSTART} --fresh" in nxt or "run examples/quickstart.yaml --fresh" in nxt
    assert "export " in nxt and "--hf" in nxt and "sweep " in nxt
    local_view.print_end(int(RunEnd.INTERRUPTED), run_dir, spec, QUICKSTART)
    assert "resume from the last checkpoint" in shown.getvalue().rsplit("next:", 1)[1]


@pytest.mark.slow  # seconds of subprocesses or models: `make test`, not `make unit`
def test_a_finished_run_is_known_from_its_records(tmp_path):
    spec = load_rlrun(QUICKSTART).spec
    run_dir = tmp_path / "quickstart"
    write_run(run_dir, records(8, reached_at=6))
    end, rec = local_view.finished_end(run_dir, spec)
    assert end == RunEnd.TARGET and rec.step == 6
    write_run(run_dir, records(8))  # not reached, budget left: it resumes
    assert local_view.finished_end(run_dir, spec) is None
    spent = spec.model_copy(update={"budget": spec.budget.model_copy(update={"max_steps": 8})})
    assert local_view.finished_end(run_dir, spent)[0] == RunEnd.BUDGET
    os.utime(run_dir / "summary.md", (time.time() - 60, time.time() - 60))  # killed before its report
    assert local_view.finished_end(run_dir, spent) is None


@pytest.mark.slow  # seconds of subprocesses or models: `make test`, not `make unit`
def test_rlscale_run_of_a_finished_run_starts_nothing(tmp_path, shown):
    rlrun = load_rlrun(QUICKSTART)
    write_run(tmp_path / "runs" / rlrun.name, records(8, reached_at=8))
    t0 = time.monotonic()
    code = run_embedded(rlrun, runs_dir=tmp_path / "runs", source=QUICKSTART)
    assert code == RunEnd.TARGET and time.monotonic() - t0 < 5
    text = shown.getvalue()
    assert "RLRun quickstart has already finished: target reached at step 8 (2,048 samples" in text
    assert "--fresh" in text and not (tmp_path / "runs" / rlrun.name / "run.json").exists()


def test_the_metrics_port_is_claimed_and_a_taken_one_moves_on():
    port = free_port()
    first = claim_metrics_port(port)
    try:
        assert first.port == port and not first.moved
        second = claim_metrics_port(port)  # another run holds it (its learner has not bound it yet)
        try:
            assert second.port > port and second.moved
            with socket.socket() as s:  # something else listens on the next one
                s.bind(("127.0.0.1", second.port + 1))
                s.listen()
                third = claim_metrics_port(second.port)
                assert third.port > second.port + 1
                third.release()
        finally:
            second.release()
    finally:
        first.release()
    again = claim_metrics_port(port)  # released at the run's end
    assert again.port == port
    again.release()


def test_the_summary_sets_the_plan_at_start_beside_the_measurement(tmp_path):
    """Each record's planned step time comes from the model recalibrated on the steps before it; the plan made
    before the first step is what a reader can hold the run to."""
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    first = {"atStep": 0, "prompts": 32, "samplesPerPrompt": 8, "calibrated": False, "samplesToTargetKnown": True,
             "predicted": {"stepSeconds": 0.5, "samplesPerSecond": 512.0, "samplesToTarget": 4096.0,
                           "timeToTargetSeconds": 8.0}}
    later = {**first, "atStep": 4, "calibrated": True, "why": "measured",
             "predicted": {**first["predicted"], "stepSeconds": 0.69}}
    (run_dir / "plan.json").write_text(json.dumps({"plans": [first, later]}))
    write_run(run_dir, records(8, reached_at=8))
    summary = (run_dir / "summary.md").read_text()
    assert "## The plan at start vs measured (uncalibrated: the accelerator profile's prediction)" in summary
    assert "| step time (s) | 0.500 | 0.700 | 1.40 |" in summary
    assert "| throughput (samples/s) | 512.0 | 365.0 | 0.71 |" in summary
    assert "| samples to target | 4,096 | 2,048 | 0.50 |" in summary  # reached at step 8: 8 x 256
    assert "| time to target (s) | 8 | 6 | 0.70 |" in summary  # 0.7 s x 8 steps = 5.6 s


def test_the_summary_holds_no_run_to_a_placeholder_samples_to_target(tmp_path):
    """A plan whose samples-to-target is the placeholder (a spec nobody measured) predicted the step, not the
    samples or the time to target: the summary shows the step's ratio and no ratio for those."""
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    first = {"atStep": 0, "prompts": 32, "samplesPerPrompt": 8, "calibrated": False, "samplesToTargetKnown": False,
             "predicted": {"stepSeconds": 0.5, "samplesPerSecond": 512.0, "samplesToTarget": 100_000.0,
                           "timeToTargetSeconds": 195.0}}
    (run_dir / "plan.json").write_text(json.dumps({"plans": [first]}))
    write_run(run_dir, records(8, reached_at=8))
    summary = (run_dir / "summary.md").read_text()
    assert "| step time (s) | 0.500 | 0.700 | 1.40 |" in summary
    assert "| samples to target | not predicted (a placeholder) | 2,048 | - |" in summary
    assert "| time to target (s) | not predicted (a placeholder) | 6 | - |" in summary
    assert "100,000" not in summary and "| 195 |" not in summary


def test_the_report_follows_the_completion_length(tmp_path):
    recs = [{**r, "batch_samples": 256, "generated_tokens": 256 * (4 if r["step"] <= 2 else 2)} for r in records(8)]
    run_dir = tmp_path / "r"
    write_run(run_dir, recs)
    summary = (run_dir / "summary.md").read_text()
    assert "- completion length: 4.0 tokens over the first 2 steps, 2.0 over the last 2" in summary
    assert (run_dir / "diagnostics.png").stat().st_size > 10_000
