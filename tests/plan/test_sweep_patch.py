"""The sweep's calibration patch and its plumbing: written, read by `rlscale plan --calibration`, flags checked."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from typer.testing import CliRunner

from rlscale.cli import app
from rlscale.plan import make_plan
from rlscale.spec import SpecError, load_rlrun
from rlscale.sweep.patch import apply_patch, load_patch, write_patch
from rlscale.sweep.report import analyse
from rlscale.sweep.runner import (
    SweepError,
    SweepState,
    combos,
    eval_every_samples,
    parse_batches,
    parse_rules,
    run_rlrun,
    settings,
)
from tests.plan.test_sweep_analysis import sweep


@pytest.fixture(scope="module")
def quick(request):
    return request.config.rootpath / "examples" / "quickstart.yaml"


@pytest.fixture(scope="module")
def patch_file(quick, tmp_path_factory):
    rlrun = load_rlrun(quick)
    res = analyse("quickstart", rlrun.spec, sweep(rules=("sqrt",), b_noise=512, window=1, gain=1.3))
    return write_patch(res, tmp_path_factory.mktemp("p") / "cal.yaml", "synthetic"), res


def test_patch_round_trip_changes_the_plan(quick, patch_file):
    path, res = patch_file
    data = load_patch(path)
    assert data["spec"]["optimizer"]["noiseScale"] == pytest.approx(res.noise.b_noise, rel=1e-3)
    rlrun, cal = apply_patch(load_rlrun(quick), data, path)
    assert rlrun.spec.optimizer.noise_scale == pytest.approx(res.noise.b_noise, rel=1e-3)
    assert cal.has_phases and cal.prompts == res.ref_prompts
    plan = make_plan(rlrun.spec, cal)
    assert plan.calibrated and plan.noise_scale == pytest.approx(res.noise.b_noise, rel=1e-3)
    # the calibrated plan predicts the fitted model's throughput at the reference batch
    ref = next(c for c in res.cells if c.prompts == res.ref_prompts)
    cand = next(c for c in plan.candidates if c.prompts == res.ref_prompts)
    assert cand.predicted.samples_per_second == pytest.approx(ref.predicted_throughput_fit, rel=1e-3)


def test_plan_cli_accepts_the_patch(quick, patch_file):
    path, res = patch_file
    r = CliRunner().invoke(app, ["plan", str(quick), "--calibration", str(path), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["calibrated"] is True and d["noiseScale"] == pytest.approx(res.noise.b_noise, rel=1e-3)
    plain = json.loads(CliRunner().invoke(app, ["plan", str(quick), "--json"]).output)
    assert plain["calibrated"] is False and plain["noiseScale"] == 2048


def test_bad_patches_name_the_field(quick, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(quick.read_text())
    r = CliRunner().invoke(app, ["plan", str(quick), "--calibration", str(bad)])
    assert r.exit_code == 1 and "kind" in r.output and "RLRunCalibration" in r.output
    bad.write_text(yaml.safe_dump({"kind": "RLRunCalibration", "spec": {"optimizer": {"noiseScale": -3}}}))
    with pytest.raises(SpecError) as e:
        apply_patch(load_rlrun(quick), load_patch(bad), bad)
    assert "optimizer.noiseScale" in str(e.value.errors[0])
    bad.write_text(yaml.safe_dump({"kind": "RLRunCalibration", "calibration": {"phases": {"decode": 1.0}}}))
    with pytest.raises(SpecError) as e:
        apply_patch(load_rlrun(quick), load_patch(bad), bad)
    assert "calibration.phases.decode" in str(e.value.errors[0])


def test_flags_are_checked_with_the_fix():
    assert parse_batches("16,8,8") == [8, 16]
    with pytest.raises(SweepError, match="--batches: 'a,b'"):
        parse_batches("a,b")
    with pytest.raises(SweepError, match="--batches"):
        parse_batches("0,8")
    assert parse_rules("sqrt,none") == ["sqrt", "none"]
    with pytest.raises(SweepError, match="--lr-rules: 'sqrt,cubic'.*sqrt,linear,none"):
        parse_rules("sqrt,cubic")


def test_runs_and_eval_spacing(quick):
    assert eval_every_samples([8, 16, 32, 64], 8, 1024) == 1024
    assert eval_every_samples([8, 24], 8, 100) == 192
    order = combos([8, 16], ["sqrt", "none"], 2)
    assert len(order) == 8 and {c.seed for c in order[:4]} == {0}
    rlrun = load_rlrun(quick)
    run = run_rlrun(rlrun, order[1], 32_768, 1024)
    s = run.spec
    assert run.name == "quickstart-p16-sqrt-s0"
    assert s.batch.prompts == 16 and s.optimizer.scaling == "sqrt" and s.budget.max_samples == 32_768
    assert s.target.eval_every == 8 and s.budget.max_steps >= 32_768 / 128
    assert make_plan(s).learning_rate == pytest.approx(1e-4)
    none64 = make_plan(run_rlrun(rlrun, order[1].__class__(64, "none", 0), 32_768, 1024).spec)
    assert none64.learning_rate == pytest.approx(1e-4) and none64.prompts == 64
    sqrt64 = make_plan(run_rlrun(rlrun, order[1].__class__(64, "sqrt", 0), 32_768, 1024).spec)
    assert sqrt64.learning_rate == pytest.approx(1e-4 * math.sqrt(4))


def test_resume_refuses_other_flags(quick, tmp_path):
    rlrun = load_rlrun(quick)
    SweepState.open(tmp_path / "s", settings(rlrun, [8, 16], ["sqrt"], 1, 4096, 1024), fresh=False)
    same = SweepState.open(tmp_path / "s", settings(rlrun, [8, 16], ["sqrt"], 1, 4096, 1024), fresh=False)
    assert same.data["settings"]["samples"] == 4096
    with pytest.raises(SweepError, match="--samples: 8192 differs.*--fresh"):
        SweepState.open(tmp_path / "s", settings(rlrun, [8, 16], ["sqrt"], 1, 8192, 1024), fresh=False)
    fresh = SweepState.open(tmp_path / "s", settings(rlrun, [8, 16], ["sqrt"], 1, 8192, 1024), fresh=True)
    assert fresh.data["runs"] == {}


# slow: 7.8 s of matplotlib and the runner's imports, kept out of `make unit`
@pytest.mark.slow
def test_an_interrupted_sweep_resumes_where_it_stopped(quick, tmp_path, monkeypatch):
    """The orchestration with a stand-in runner: finished runs are kept, the interrupted one runs again."""
    import rlscale.embedded
    from rlscale.roles import RunEnd
    from rlscale.sweep.runner import run_sweep, write_sweep_report
    from tests.plan.test_sweep_analysis import synthetic_run

    calls = []
    stop_at = {"name": "quickstart-p16-sqrt-s0"}

    def fake_run(rlrun, *, runs_dir, fresh, seed, replan, render, metrics_port=0, **_):
        calls.append((rlrun.name, {"seed": seed, "replan": replan}))
        assert replan is False and fresh is False
        s = rlrun.spec
        d = runs_dir / rlrun.name
        d.mkdir(parents=True, exist_ok=True)
        run = synthetic_run(s.batch.prompts, s.optimizer.scaling, seed, samples=s.budget.max_samples,
                            eval_every=1024)
        (d / "metrics.jsonl").write_text("".join(r.to_json() + "\n" for r in run.records))
        render(None)
        render(run.records[-1])
        if rlrun.name == stop_at.get("name"):
            stop_at.clear()
            return RunEnd.INTERRUPTED
        return RunEnd.BUDGET

    monkeypatch.setattr(rlscale.embedded, "run_embedded", fake_run)
    rlrun = load_rlrun(quick)
    out = tmp_path / "quickstart-sweep"
    done, code = run_sweep(rlrun, out, [8, 16], ["sqrt", "none"], 1, 8192, 1024)
    assert (done, code) == (1, RunEnd.INTERRUPTED)
    state = json.loads((out / "sweep.json").read_text())["runs"]
    assert state["quickstart-p8-sqrt-s0"]["status"] == "done"
    assert state["quickstart-p16-sqrt-s0"]["status"] == "interrupted"
    calls.clear()
    done, code = run_sweep(rlrun, out, [8, 16], ["sqrt", "none"], 1, 8192, 1024)
    # 3 runs for 4 combinations: at the reference batch (16 prompts) none's lr is sqrt's, and the sqrt run serves both.
    assert (done, code) == (3, 0)
    assert [n for n, _ in calls] == ["quickstart-p16-sqrt-s0", "quickstart-p8-none-s0"]
    md, res = write_sweep_report(rlrun, out, tmp_path / "cal.yaml")
    assert "## Rule none" in md.read_text() and (out / "decision.png").exists()
    assert "3 runs for 4 combinations" in md.read_text()
    rows = json.loads((out / "runs.json").read_text())["runs"]
    assert len(rows) == 4 and all(r["samplesToLevel"] for r in rows)
    assert load_patch(tmp_path / "cal.yaml")["kind"] == "RLRunCalibration"
