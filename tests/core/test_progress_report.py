"""The progress report the operator plans from: the driver's windowed noise scale wins over the per-step EMA."""

from rlscale.kube_report import progress_body

REC = {"step": 40, "samples": 5120, "reward_mean": 0.5, "samples_per_second": 300.0, "wall_seconds": 20.0,
       "phases": {"generate": 0.2, "train": 0.25}, "noise_scale": 22_000.0}


def test_the_windowed_noise_scale_is_reported_even_when_it_is_none():
    assert progress_body({**REC, "noise_scale_window": 900.0}, target_reached=False)["noiseScale"] == 900.0
    # not significant: no measurement, so the operator keeps the spec's or default value
    assert progress_body({**REC, "noise_scale_window": None}, target_reached=False)["noiseScale"] is None


def test_records_from_older_drivers_still_report_their_noise_scale():
    assert progress_body(REC, target_reached=False)["noiseScale"] == 22_000.0


def test_the_drift_check_reads_the_recent_median_rate_not_one_steps():
    # One step's rate swung 143 -> 270 -> 187 samples/s on a busy node, and each swing past
    # 20% re-planned the run; the median over recent steps is what the operator compares.
    body = progress_body({**REC, "samples_per_second_recent": 250.0}, target_reached=False)
    assert body["samplesPerSecond"] == 250.0
    assert progress_body(REC, target_reached=False)["samplesPerSecond"] == 300.0  # older drivers


def test_the_last_report_says_how_the_run_ended_and_where_its_report_is():
    body = progress_body(REC, target_reached=True, outcome="Succeeded", report="/checkpoints/report on r-learner-0")
    assert body["outcome"] == "Succeeded" and body["report"].endswith("r-learner-0")
    assert "outcome" not in progress_body(REC, target_reached=False)


def test_non_finite_figures_never_reach_the_api_server():
    import json
    import math

    from rlscale.kube_report import failure_body, finite, progress_body

    rec = {"step": 3, "samples": 384, "reward_mean": float("nan"), "samples_per_second": float("inf"),
           "phases": {"train": float("-inf"), "generate": 0.5}, "noise_scale": float("nan")}
    body = progress_body(rec, target_reached=False)
    text = json.dumps(body, allow_nan=False)  # raises on NaN or infinity
    assert body["reward"] is None and body["samplesPerSecond"] is None and body["noiseScale"] is None
    assert body["phaseSeconds"] == {"train": None, "generate": 0.5} and "NaN" not in text
    assert finite([1.0, math.nan, {"a": math.inf}]) == [1.0, None, {"a": None}]
    f = failure_body(None, "x" * 5000, permanent=True)
    assert f["failed"] is True and f["outcome"] == "Failed" and len(f["message"]) == 1024
    assert "outcome" not in failure_body(rec, "boom", permanent=False)
