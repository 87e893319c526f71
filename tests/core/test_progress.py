"""Target tracking, the run report and the run metrics, without any heavy component."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from rlscale.progress import TargetTracker, fmt_duration, fmt_lr
from rlscale.records import StepRecord, read_jsonl
from rlscale.report import write_report
from rlscale.run_metrics import RunMetrics


def test_target_needs_a_full_window_of_evals():
    t = TargetTracker(target=0.8, window=3)
    assert t.add(10, 1000, 5.0, 0.95) == pytest.approx(0.95)
    assert not t.reached  # one lucky eval is not enough
    t.add(20, 2000, 10.0, 0.70)
    avg = t.add(30, 3000, 15.0, 0.70)
    assert avg == pytest.approx((0.95 + 0.70 + 0.70) / 3) and not t.reached
    t.add(40, 4000, 20.0, 0.95)  # (0.70 + 0.70 + 0.95) / 3 < 0.8
    assert not t.reached
    t.add(50, 5000, 25.0, 0.95)  # (0.70 + 0.95 + 0.95) / 3 >= 0.8
    assert t.reached and t.reached_at == {"step": 50, "samples": 5000, "seconds": 25.0}
    t.add(60, 6000, 30.0, 0.1)
    assert t.reached_at["step"] == 50  # the first time counts


def test_eta_from_progress_per_sample():
    t = TargetTracker(target=0.8, window=1)
    t.add(1, 0, 0.0, 0.4)
    t.add(2, 1000, 10.0, 0.5)
    # 0.1 per 1000 samples, 0.3 to go -> 3000 samples; at 100 samples/s -> 30 s
    assert t.eta_seconds(100.0) == pytest.approx(30.0)
    t.add(3, 2000, 20.0, 0.45)
    t2 = TargetTracker(target=0.8, window=1)
    t2.add(1, 0, 0, 0.5)
    t2.add(2, 1000, 1, 0.4)
    assert t2.eta_seconds(100.0) is None  # not improving: no honest ETA


def test_tracker_state_round_trip():
    t = TargetTracker(target=0.8, window=3)
    for i, v in enumerate([0.5, 0.6, 0.7]):
        t.add(i, i * 100, float(i), v)
    u = TargetTracker(target=0.8, window=3)
    u.load_state_dict(json.loads(json.dumps(t.state_dict())))
    assert u.add(4, 400, 4.0, 0.9) == t.add(4, 400, 4.0, 0.9)


def _dicts(n: int = 30) -> list[dict]:
    recs = []
    for i in range(1, n + 1):
        ev = 0.4 + 0.5 * i / n if i % 5 == 0 else None
        recs.append({
            "step": i, "samples": 128 * i, "batch_samples": 128, "wall_seconds": 0.5 * i, "prompts": 16,
            "samples_per_prompt": 8,
            "phases": {"generate": 0.2, "reward": 0.01, "train": 0.25, "sync": 0.04}, "step_seconds": 0.5,
            "samples_per_second": 256.0, "reward_mean": 0.3 + 0.01 * i, "eval": ev, "target_metric": ev,
            "predicted_step_seconds": 0.45, "generated_tokens": 400, "trained_tokens": 1300, "weights_version": i,
            "overhead_seconds": 0.05, "noise_scale": 300.0,
            "time_to_target_seconds": 15.0 if i >= n else None, "samples_to_target": 128 * n if i >= n else None,
            # Step diagnostics; step 3 was skipped (no group with mixed rewards: nothing trained).
            "mixed_group_fraction": 0.0 if i == 3 else 0.5, "entropy": None if i == 3 else 2.0 - 0.05 * i,
            "clip_fraction": None if i == 3 else 0.01 * i, "grad_norm": None if i == 3 else 0.5 + 0.1 * i,
            "logprob_diff": None if i == 3 else -1e-3, "logprob_abs_diff": None if i == 3 else 2e-3,
        })
    return recs


def _records(n: int = 30) -> list[StepRecord]:
    return [StepRecord.from_dict(d) for d in _dicts(n)]


@pytest.mark.slow  # seconds of subprocesses or models: `make test`, not `make unit`
def test_report_files(tmp_path: Path):
    recs = _dicts()
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n{\"step\": 31, \"trunc")
    (tmp_path / "plan.json").write_text(json.dumps({"plans": [{"atStep": 0, "prompts": 16, "samplesPerPrompt": 8,
                                                               "learningRate": 1e-4,
                                                              "rolloutReplicas": 1, "learnerReplicas": 1, "reason":
                                                               "N=128 kept"}]}))
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 30  # the cut-off last line is dropped
    summary = write_report(tmp_path, 0.8, "eval/accuracy", "t").read_text()
    assert "time to target**: 15.0 s" in summary and "samples to target**: 3,840" in summary
    assert "measured 0.500 s, planned 0.450 s" in summary
    png = (tmp_path / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    # Diagnostics: medians over the first and last 7 steps (step 3, skipped, has none), the last value.
    assert "| diagnostic | median, first 7 steps | median, last 7 steps | last |" in summary
    assert "| mixed groups | 50% | 50% | 50% |" in summary
    assert "| entropy | 1.775 | 0.650 | 0.500 |" in summary  # 2 - 0.05 i: i in 1,2,4..7 -> 4.5; 24..30 -> 27
    assert "| grad norm | 0.95 | 3.2 | 3.5 |" in summary
    assert "| logp rollout-learner | -1.00e-03 | -1.00e-03 | -1.00e-03 |" in summary
    png = (tmp_path / "diagnostics.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


@pytest.mark.slow  # seconds of subprocesses or models: `make test`, not `make unit`
def test_report_of_a_run_without_diagnostics_says_so(tmp_path: Path):
    keys = ("mixed_group_fraction", "entropy", "clip_fraction", "grad_norm", "logprob_diff", "logprob_abs_diff")
    recs = [{k: v for k, v in r.items() if k not in keys} for r in _dicts(4)]  # a log written before them
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    summary = write_report(tmp_path, 0.8, "eval/accuracy", "t").read_text()
    assert "| clipped | - | - | - |" in summary
    assert (tmp_path / "diagnostics.png").exists()


def test_every_diagnostic_has_a_gauge_and_a_format():
    from rlscale import metrics_names as names
    from rlscale.progress import DIAGNOSTIC_FORMATS, fmt_diagnostics

    assert [k for k, _, _ in DIAGNOSTIC_FORMATS] == list(names.DIAGNOSTIC_KEYS)
    assert all(v.startswith(names.PREFIX) for v in names.DIAGNOSTICS.values())
    rec = _records(4)[-1]
    assert dict(fmt_diagnostics(rec)) == {"mixed groups": "50%", "entropy": "1.800", "clipped": "4.0%",
                                          "grad norm": "0.9", "logp rollout-learner": "-1.00e-03",
                                          "abs logp diff": "2.00e-03"}
    assert set(dict(fmt_diagnostics(_records(3)[-1])).values()) == {"0%", "-"}  # the skipped step


def test_live_view_shows_the_diagnostics():
    from rich.console import Console
    from rich.progress import Progress

    from rlscale.embedded import progress_view

    console = Console(width=200, record=True)
    console.print(progress_view(_records(4)[-1], 0.8, "eval/accuracy", 10_000, Progress(console=console)))
    text = console.export_text()
    assert "diagnostics" in text and "mixed groups 50%" in text and "grad norm 0.9" in text
    assert "abs logp diff 2.00e-03" in text


def test_run_metrics_expose_every_name_and_pass_promtool(tmp_path: Path):
    from rlscale import metrics_names as names

    m = RunMetrics()
    assert "rlscale_gradient_norm NaN" in generate_latest(m.registry).decode()  # before any step: not measured
    from rlscale.plan import make_plan
    from rlscale.spec import load_rlrun
    from tests.conftest import EXAMPLES

    m.set_plan(make_plan(load_rlrun(EXAMPLES / "quickstart.yaml").spec))
    for r in _records(30)[:3]:
        r.reward_terms = {"exact-match": r.reward_mean}  # a labelled gauge shows once a term is set
        m.observe_step(r)
    text = generate_latest(m.registry).decode()
    metric_names = [v for k, v in vars(names).items()
                     if k.isupper() and isinstance(v, str) and v.startswith("rlscale_") and not v.endswith("_")]
    for n in metric_names:
        assert f"\n{n}" in "\n" + text or f"{n}_bucket" in text, n
    assert 'rlscale_step_phase_seconds_count{phase="train"} 3.0' in text
    assert "rlscale_time_to_target_seconds 15.0" not in text  # not reached within 3 records
    # Step 3 trained nothing: its mixed-group share is 0; the others keep step 2's values.
    assert "rlscale_mixed_reward_groups_ratio 0.0" in text
    assert "rlscale_policy_entropy_nats 1.9" in text and "rlscale_gradient_norm 0.7" in text
    assert "# TYPE rlscale_clipped_tokens_ratio gauge" in text
    assert "# HELP rlscale_logprob_diff_nats Rollout engine minus learner log-prob" in text
    promtool = shutil.which("promtool") or str(Path.home() / ".cache/rlscale/prometheus/promtool")
    if not Path(promtool).exists():
        pytest.fail("promtool missing: run `make prometheus` (make test does)")
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), res.stdout + res.stderr


def test_tail_follows_appends_and_a_rewrite(tmp_path):
    import os

    from rlscale.embedded import JsonlTail

    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1}\n{"step": 2}\n')
    t = JsonlTail(p)
    t.skip_existing()
    assert t.read() == []
    with open(p, "a") as f:
        f.write('{"step": 3}\n{"step": 4, "half')
    assert [r.step for r in t.read()] == [3]  # the half-written line waits
    with open(p, "a") as f:
        f.write('": 1}\n')
    assert [r.step for r in t.read()] == [4]
    tmp = tmp_path / "m.tmp"
    tmp.write_text('{"step": 1}\n')  # a resume rewrites the log shorter, atomically
    os.replace(tmp, p)
    assert [r.step for r in t.read()] == [1]


def test_one_duration_and_lr_format_for_every_reader():
    # A step time keeps its hundredths; longer spans read as the operator's printer columns do.
    assert [fmt_duration(s) for s in (None, 0.734, 9.994, 45, 252, 599.6, 3 * 3600 + 5 * 60)] == \
        ["-", "0.73s", "9.99s", "45s", "4m12s", "10m00s", "3h05m"]
    assert fmt_duration(-1) == "0.00s"
    assert fmt_lr(1e-4 * 2**0.5) == "1.41e-04"


def test_dashboard_plots_every_diagnostic():
    from rlscale import metrics_names as names
    from tests.conftest import ROOT

    dash = json.loads((ROOT / "charts/rlscale/dashboards/rlscale.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", []))
    assert [n for n in names.DIAGNOSTICS.values() if n + "{" not in exprs] == []
