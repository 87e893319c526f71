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
