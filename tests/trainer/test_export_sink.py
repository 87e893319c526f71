"""spec.export.hf: the end-of-run export sink. With the real learner (one rank at ZeRO 0; two at ZeRO 3,
the followers joining the gathers) the directory loads with transformers and holds exactly the learner's
weights; a failure mid-write leaves no export/hf (an earlier one stays); an interrupted run exports nothing;
the run log's summary and the last progress report name the export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlscale.records import StepRecord
from rlscale.roles import RunEnd, free_port
from rlscale.trainer.export_hf import MARKER
from rlscale.trainer.export_sink import HfExportSink, export_dir, export_sinks
from tests.trainer.test_checkpoint_per_rank import batch  # three groups of three, mixed rewards

WORKER = Path(__file__).with_name("export_sink_worker.py")


class FakeLearner:
    """iter_weights over fixed weights (the model's own names); records whether the stream was finished
    or closed, as a follower's gathers need."""

    def __init__(self, weights: dict[str, torch.Tensor]):
        self.weights, self.finished, self.closed = weights, False, False

    def iter_weights(self):
        try:
            for name, t in self.weights.items():
                yield name, t.clone()
            self.finished = True
        except GeneratorExit:
            self.closed = True
            raise


class Told:
    def __init__(self):
        self.notes: list[dict] = []

    def exported(self, note: dict) -> None:
        self.notes.append(note)


@pytest.fixture(scope="module")
def model_and_weights(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from rlscale.trainer.modeling import save_random_model

    path = save_random_model(tmp_path_factory.mktemp("model") / "m", hidden_size=64, num_layers=1, num_heads=1,
                             head_dim=64, intermediate_size=128, seed=1)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    # "Trained" weights: not the ones in the model directory.
    return path, {n: p.detach() + 0.25 for n, p in model.named_parameters()}


def _sink(tmp_path: Path, model: Path, learner, **kw) -> HfExportSink:
    run_dir = tmp_path / "run"
    return HfExportSink(learner, model, export_dir(run_dir, in_pod=False), "float32", run_dir, **kw)


def _params(path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return {n: p.detach() for n, p in AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
            .named_parameters()}


@pytest.mark.slow  # seconds of subprocesses or models: `make test`, not `make unit`
def test_a_finished_run_writes_the_learners_weights_and_tells_the_sinks(tmp_path, model_and_weights):
    model, weights = model_and_weights
    told = Told()
    sink = _sink(tmp_path, model, FakeLearner(weights), notify=[told, object()])
    sink.end(RunEnd.BUDGET, [StepRecord(step=7)], False)
    out = tmp_path / "run" / "export" / "hf"
    got = _params(out)
    assert set(got) == set(weights) and all(torch.equal(got[n], t) for n, t in weights.items())
    assert (out / "tokenizer.json").is_file() and json.loads((out / MARKER).read_text())["step"] == 7
    note = json.loads((tmp_path / "run" / "export.json").read_text())
    assert note["path"] == str(out.resolve()) and note["step"] == 7 and "error" not in note
    assert told.notes == [note] and sink.learner.finished
    assert [p.name for p in out.parent.iterdir()] == ["hf"]  # no temporary directory left


def test_an_interrupted_run_exports_nothing(tmp_path, model_and_weights):
    model, weights = model_and_weights
    told = Told()
    sink = _sink(tmp_path, model, FakeLearner(weights), notify=[told])
    sink.end(RunEnd.INTERRUPTED, [StepRecord(step=3)], False)
    assert not (tmp_path / "run" / "export").exists() and told.notes == []
    assert not sink.learner.finished and not sink.learner.closed  # no gather started


def test_a_failure_mid_write_leaves_no_export_and_keeps_the_earlier_one(tmp_path, model_and_weights):
    model, weights = model_and_weights
    _sink(tmp_path, model, FakeLearner(weights)).end(RunEnd.TARGET, [StepRecord(step=5)], True)
    out = tmp_path / "run" / "export" / "hf"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    # A stream whose third tensor does not fit the model: save_hf stops mid-stream.
    bad = dict(weights)
    third = list(bad)[2]
    bad[third] = torch.zeros(3, 3)
    told = Told()
    broken = FakeLearner(bad)
    _sink(tmp_path, model, broken, notify=[told]).end(RunEnd.TARGET, [StepRecord(step=9)], True)
    assert broken.closed  # closed, so a ZeRO-3 follower would still finish its gathers
    (note,) = told.notes
    assert note["step"] == 9 and "ExportError" in note["error"] and third in note["error"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the step-5 export, untouched
    assert [p.name for p in out.parent.iterdir()] == ["hf"]
    # Fresh: a failure after files were written leaves no export/hf at all.
    fresh = tmp_path / "fresh"
    sink = _sink(fresh, model, FakeLearner(weights), notify=[told])
    from transformers import PreTrainedModel

    def full_disk(self, path, **kw):
        (Path(path) / "model.safetensors").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    orig = PreTrainedModel.save_pretrained
    PreTrainedModel.save_pretrained = full_disk
    try:
        sink.end(RunEnd.TARGET, [StepRecord(step=2)], True)
    finally:
        PreTrainedModel.save_pretrained = orig
    assert "No space left" in told.notes[-1]["error"]
    assert list((fresh / "run" / "export").iterdir()) == []


@pytest.mark.slow  # seconds of subprocesses or models: `make test`, not `make unit`
def test_the_summary_and_the_last_progress_report_name_the_export(tmp_path, model_and_weights):
    from rlscale.progress_report import export_words
    from rlscale.trainer.sinks import KubeSink, RunLog

    class Reporter:
        def __init__(self):
            self.sent: list = []

        def report(self, body, force=False):
            self.sent.append(body)
            return True

        def due(self):
            return True

    model, weights = model_and_weights
    run_dir = tmp_path / "run"
    reporter = Reporter()
    kube = KubeSink(reporter, f"{run_dir} on r-learner-0")
    run_log = RunLog(run_dir, 0.8, "eval/accuracy", "r")
    rec = StepRecord(step=4, samples=64, samples_per_second=10.0, wall_seconds=6.0, phases={"train": 1.0})
    run_log.record(rec, [rec])
    # The order Driver.from_config gives them: the export first, then the run log and the pod's sinks.
    sinks = [*export_sinks(_Cfg(model), FakeLearner(weights), run_dir, notify=[kube]), run_log, kube]
    for s in sinks:
        s.end(RunEnd.TARGET, [rec], True)
    last = reporter.sent[-1]
    assert last.outcome is not None and last.export["path"].endswith("export/hf") and last.export["step"] == 4
    assert export_words(last.export) in (run_dir / "summary.md").read_text()


class _Cfg:
    """The RunConfig fields export_sinks reads (a local run)."""

    def __init__(self, model: Path, hf: bool = True, local: object = True):
        from rlscale.spec import parse_spec

        self.spec = parse_spec({"hardware": {"accelerator": "cpu"}, "export": {"hf": hf}})
        self.model_dir, self.local = str(model), local


def test_export_sinks_follow_the_spec_and_put_the_model_beside_the_report(tmp_path, monkeypatch):
    assert export_sinks(_Cfg(tmp_path, hf=False), object(), tmp_path / "run") == []
    (local,) = export_sinks(_Cfg(tmp_path), object(), tmp_path / "run")
    assert local.out == tmp_path / "run" / "export" / "hf" and local.pod is None
    monkeypatch.setenv("POD_NAME", "r-learner-0")
    (pod,) = export_sinks(_Cfg(tmp_path, local=None), object(), Path("/checkpoints/report"))
    assert pod.out == Path("/checkpoints/export/hf") and pod.pod == "r-learner-0"
    assert pod.report_dir == Path("/checkpoints/report")


@pytest.mark.slow
@pytest.mark.parametrize("ranks,stage", [(1, 0), (2, 3)])
def test_the_real_learner_exports_exactly_its_weights(tmp_path, small_model, ranks, stage):
    args = {"config": {"model_path": str(small_model), "zero_stage": stage, "micro_batch": 4, "lr": 1e-3},
            "out": str(tmp_path), "lr": 1e-3, "batches": [batch(1)]}
    (tmp_path / "args.json").write_text(json.dumps(args))
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(tmp_path / "args.json")], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env=dict(os.environ, RANK=str(r), LOCAL_RANK="0", WORLD_SIZE=str(ranks),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1"))
             for r in range(ranks)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]
    published = torch.load(tmp_path / "published.pt")
    # Every rank took part in the export's gathers: the gather after it completed and agrees.
    after = torch.load(tmp_path / "after.pt")
    assert all(torch.equal(after[n], t) for n, t in published.items())
    (note,) = json.loads((tmp_path / "told.json").read_text())
    out = tmp_path / "run" / "export" / "hf"
    assert "error" not in note and note["path"] == str(out.resolve()) and note["step"] == 1
    got = _params(out)
    assert set(got) == set(published)
    for name, t in published.items():
        assert torch.equal(got[name], t), name  # copied, not recomputed: equal bit for bit
    start = _params(small_model)
    assert any(not torch.equal(start[n], t) for n, t in published.items())  # trained
    assert json.loads((out / MARKER).read_text())["zeroStage"] == stage
