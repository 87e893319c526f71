"""Multi-turn runs' tool figures (StepRecord.tools) reach metrics.jsonl's flat keys, Prometheus and the report."""

from __future__ import annotations

from rlscale.records import StepRecord
from rlscale.report import plot_diagnostics, summarize, tool_lines
from rlscale.run_metrics import RunMetrics


def _records() -> list[StepRecord]:
    return [StepRecord(step=i, batch_samples=8, generated_tokens=80,
                       tools={"turns": 1.0 + i / 10, "calls_per_trajectory": i / 10, "calls": 0.8 * i, "errors": 1.0,
                              "seconds": 0.5, "truncated": 2.0, "with_calls": i / 10}) for i in range(1, 9)]


def test_the_figures_flatten_and_count_in_prometheus():
    recs = _records()
    assert recs[0].scalars()["tools/calls_per_trajectory"] == 0.1
    m = RunMetrics()
    for r in recs:
        m.observe_step(r)
    get = m.registry.get_sample_value
    assert get("rlscale_tool_calls_total") == sum(r.tools["calls"] for r in recs)
    assert get("rlscale_tool_errors_total") == 8 and get("rlscale_truncated_trajectories_total") == 16
    assert get("rlscale_tool_seconds_total") == 4.0 and get("rlscale_turns_per_trajectory") == recs[-1].tools["turns"]


def test_the_report_says_how_tool_use_changed_and_plots_it(tmp_path):
    recs = _records()
    (line,) = tool_lines(recs)
    assert "0.15 over the first 2 steps, 0.75 over the last 2" in line and "8 failed" in line
    assert line in summarize(recs, [], 0.8, "eval/accuracy", "t")
    assert tool_lines([StepRecord(step=1)]) == []
    assert plot_diagnostics(recs, tmp_path / "d.png").stat().st_size > 0


def test_the_planner_counts_turns_and_tool_seconds():
    from rlscale.plan.calibration import Calibration
    from rlscale.plan.decision import system_model
    from rlscale.spec import load_rlrun
    from tests.conftest import EXAMPLES

    spec = load_rlrun(EXAMPLES / "tools-quickstart.yaml").spec
    single = spec.model_copy(deep=True)
    single.task.tools, single.task.max_turns = None, 1
    two, one = system_model(spec), system_model(single)
    assert (two.turns, one.turns) == (2.0, 1.0)
    assert two.generation(16, 8, 1).seconds > one.generation(16, 8, 1).seconds
    recs = [StepRecord(step=i, prompts=16, samples_per_prompt=8, phases={"generate": 1.0},
                       tools={"turns": 1.4, "wall_seconds": 0.3}) for i in range(1, 4)]
    cal = Calibration.from_steps(recs)
    assert (cal.turns, cal.tool_seconds) == (1.4, 0.3)
    assert Calibration.from_dict(cal.to_dict()).turns == 1.4
    measured = system_model(spec, cal)
    assert (measured.turns, measured.tool_seconds) == (1.4, 0.3)
    assert measured.generation(16, 8, 1).seconds - system_model(spec, Calibration(turns=1.4)).generation(
        16, 8, 1).seconds == __import__("pytest").approx(0.3)
