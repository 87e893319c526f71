"""The trackers of spec.logging, as sinks: a few step records written through each one and read back
with the tracker's own reader; a tracker without its package is refused before the run."""

from __future__ import annotations

import importlib.util
import time
from types import SimpleNamespace

import pytest

from rlscale.plan import make_plan
from rlscale.records import ShownSample, StepRecord
from rlscale.roles import RunEnd
from rlscale.spec import SpecError, load_rlrun
from rlscale.trainer import trackers
from tests.conftest import EXAMPLES


def spec_with(**logging):
    spec = load_rlrun(EXAMPLES / "quickstart.yaml").spec.model_copy(deep=True)
    spec.logging = spec.logging.model_copy(update={"project": "rlscale-test", **logging})
    spec.task = spec.task.model_copy(update={"reward": "0.9*exact-match + 0.1*format"})
    return spec


def records(n: int = 3, start: int = 1) -> list[StepRecord]:
    return [StepRecord(step=s, samples=128 * s, reward_mean=0.1 * s, lr=1e-4, loss=0.5 / s, time=1.7e9 + s,
                       phases={"generate": 0.5, "train": 0.25}, reward_terms={"exact-match": 0.1 * s, "format": 1.0},
                       reward_timeouts=s % 2, sample=ShownSample("1+1=", "2", "2", 1.0, True))
            for s in range(start, start + n)]


def drive(sink, recs, resumed=False, state_step=0, end=RunEnd.BUDGET):
    spec = sink.spec
    sink.start(make_plan(spec), SimpleNamespace(step=state_step), resumed)
    for r in recs:
        sink.record(r, recs)
    sink.end(end, recs, False)
    assert not sink.failed


def test_a_tracker_without_its_package_is_refused_naming_the_field_and_the_fix(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(SpecError) as err:
        trackers.tracker_sinks(spec_with(mlflow=True), tmp_path, "t")
    assert "spec.logging.mlflow: true needs the mlflow package" in str(err.value)
    assert "pip install 'rlscale[tracking]'" in str(err.value)
    assert trackers.tracker_sinks(spec_with(), tmp_path, "t") == []  # none asked for: nothing imported


def test_tensorboard_event_files_hold_every_key_at_its_step(tmp_path):
    __import__("tensorboard")  # installed by make venv (the tracking extra): missing is a failure, not a skip
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (sink,) = trackers.tracker_sinks(spec_with(tensorboard=True), tmp_path, "t")
    drive(sink, records())
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"reward_mean", "reward/exact-match", "reward/format", "reward/timeouts", "phases/generate",
            "loss"} <= set(tags)
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("reward/exact-match")] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert [e.value for e in acc.Scalars("reward/timeouts")] == [1, 0, 1]
    assert {"plan/text_summary", "spec/text_summary"} <= set(acc.Tags()["tensors"])  # the plan and spec, as text


def test_mlflow_file_store_holds_the_metrics_and_the_plan_and_spec_as_params(tmp_path, monkeypatch):
    __import__("mlflow")  # installed by make venv (the tracking extra): missing is a failure, not a skip
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # as the sink sets it, for the reader below
    spec = spec_with(mlflow=True)
    (sink,) = trackers.tracker_sinks(spec, tmp_path, "quick")
    drive(sink, records(3))
    # A resume from the checkpoint at step 2 continues the same MLflow run.
    (again,) = trackers.tracker_sinks(spec, tmp_path, "quick")
    drive(again, records(2, start=3), resumed=True, state_step=2)
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    exp = client.get_experiment_by_name("rlscale-test")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == "quick" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "reward/exact-match")
    assert sorted((m.step, round(m.value, 6)) for m in history) == [(1, 0.1), (2, 0.2), (3, 0.3), (3, 0.3),
                                                                     (4, 0.4)]
    assert {"reward_mean", "reward/format", "reward/timeouts", "phases/train"} <= set(run.data.metrics)
    assert run.data.params["spec.task.reward"] == "0.9*exact-match + 0.1*format"
    assert run.data.params["plan.prompts"] == str(make_plan(spec).prompts)


@pytest.mark.slow  # seconds of subprocesses or models: `make test`, not `make unit`
def test_wandb_offline_run_folder_holds_the_keys(tmp_path, monkeypatch):
    __import__("wandb")  # installed by make venv (the tracking extra): missing is a failure, not a skip
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    (sink,) = trackers.tracker_sinks(spec_with(wandb=True), tmp_path, "quick")
    drive(sink, records())
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    # Offline, the run is one record log (`wandb sync` uploads it): every key and the config are in it.
    (log,) = runs[0].glob("run-*.wandb")
    # wandb's service process writes the log after finish() returns: under load (a suite beside five
    # other jobs on 2 cores) it held only its 7-byte header when read at once.
    deadline = time.monotonic() + 60
    while b"_step" not in (data := log.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    for key in ("reward/exact-match", "reward/format", "reward/timeouts", "phases/generate", "reward_mean", "_step"):
        assert key.encode() in data, key
    assert b"0.9*exact-match + 0.1*format" in data  # the spec, in the run's config
