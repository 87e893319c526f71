"""The progress report the operator plans from: derived from the step record, camelCase on the wire."""

import json
import math

from rlscale.progress_report import ProgressReport
from rlscale.records import StepRecord, finite
from rlscale.roles import Outcome

REC = StepRecord(step=40, samples=5120, reward_mean=0.5, samples_per_second=300.0, wall_seconds=20.0,
                 phases={"generate": 0.2, "train": 0.25}, noise_scale=22_000.0, prompts=16, samples_per_prompt=8,
                 rollout_replicas=1, learner_replicas=2, lr=1e-4)


def report(rec: StepRecord = REC, **kw) -> dict:
    return ProgressReport.from_record(rec, target_reached=False, **kw).to_wire()


def with_(**changes) -> StepRecord:
    return StepRecord(**{**REC.__dict__, **changes})


def test_the_windowed_noise_scale_is_reported_and_none_is_left_out():
    assert report(with_(noise_scale_window=900.0))["noiseScale"] == 900.0
    # not significant: no measurement, so the operator keeps the spec's or default value (the
    # per-step EMA in noise_scale swings by 100x and is never sent in its place)
    assert "noiseScale" not in report(with_(noise_scale_window=None))


def test_the_rate_is_the_recent_median_not_one_steps():
    # One step's rate swung 143 -> 270 -> 187 samples/s on a busy node; the operator reads the
    # median over recent steps.
    assert report(with_(samples_per_second_recent=250.0))["samplesPerSecond"] == 250.0
    assert report(REC)["samplesPerSecond"] == 300.0  # no median yet: the step's own


def test_the_report_names_the_configuration_the_driver_runs():
    body = report()
    assert (body["prompts"], body["samplesPerPrompt"], body["rolloutReplicas"], body["learnerReplicas"]) == \
        (16, 8, 1, 2) and body["learningRate"] == 1e-4


def test_the_last_report_says_how_the_run_ended_and_where_its_report_is():
    body = ProgressReport.from_record(REC, target_reached=True, outcome=Outcome.SUCCEEDED,
                                      report="/checkpoints/report on r-learner-0").to_wire()
    assert body["outcome"] == "Succeeded" and body["report"].endswith("r-learner-0")
    assert "outcome" not in report()


def test_the_wire_round_trips_and_unknown_keys_are_dropped():
    sent = ProgressReport.from_record(with_(time_to_target_seconds=12.5, samples_to_target=4096),
                                      target_reached=True, outcome=Outcome.BUDGET_EXHAUSTED,
                                      measurements={"step": 40})
    wire = json.loads(sent.to_json())
    got = ProgressReport.from_wire({**wire, "fromAFutureDriver": 1})
    assert got == sent and got.outcome is Outcome.BUDGET_EXHAUSTED
    assert set(wire) <= set(ProgressReport.keys())
    assert ProgressReport.from_wire({"outcome": "Exploded"}).outcome is None


def test_non_finite_figures_never_reach_the_api_server():
    rec = StepRecord(step=3, samples=384, reward_mean=float("nan"), samples_per_second=float("inf"),
                     phases={"train": float("-inf"), "generate": 0.5}, noise_scale_window=float("nan"))
    body = report(rec)
    text = json.dumps(body, allow_nan=False)  # raises on NaN or infinity
    assert body["reward"] is None and body["samplesPerSecond"] is None and body.get("noiseScale") is None
    assert body["phaseSeconds"] == {"train": None, "generate": 0.5} and "NaN" not in text
    assert finite([1.0, math.nan, {"a": math.inf}]) == [1.0, None, {"a": None}]
    f = ProgressReport.failure(None, "x" * 5000, permanent=True).to_wire()
    assert f["failed"] is True and f["outcome"] == "Failed" and len(f["message"]) == 1024
    assert "outcome" not in ProgressReport.failure(rec, "boom", permanent=False).to_wire()
