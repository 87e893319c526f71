"""spec.export.hf in the run's own report: the progress report's export on the wire, the summary's line,
and the console's end line."""

from __future__ import annotations

import json

from rlscale.progress_report import ProgressReport, export_words
from rlscale.records import StepRecord
from rlscale.report import EXPORT_NOTE, export_suffix, read_export_note, summarize

REC = StepRecord(step=12, samples=768, samples_per_second=20.0, wall_seconds=40.0, phases={"train": 1.0})


def test_the_export_round_trips_on_the_wire():
    export = {"path": "/checkpoints/export/hf", "pod": "r-learner-0", "step": 12, "seconds": 1.5}
    sent = ProgressReport.from_record(REC, target_reached=False, export=export)
    wire = json.loads(sent.to_json())
    assert wire["export"] == export and "export" in ProgressReport.keys()
    assert ProgressReport.from_wire(wire) == sent


def test_the_export_in_words():
    assert export_words(None) is None and export_words({}) is None
    assert export_words({"path": "runs/q/export/hf", "step": 12}) == "exported to runs/q/export/hf (step 12)"
    assert export_words({"path": "/checkpoints/export/hf", "pod": "r-learner-0", "error": "OSError: full"}) == \
        "the export to /checkpoints/export/hf on r-learner-0 failed: OSError: full"


def test_the_summary_and_the_console_line_name_the_export(tmp_path):
    assert read_export_note(tmp_path) is None and export_suffix(tmp_path) == ""
    note = {"path": str(tmp_path / "export" / "hf"), "step": 12}
    (tmp_path / EXPORT_NOTE).write_text(json.dumps(note))
    assert read_export_note(tmp_path) == note
    assert export_suffix(tmp_path) == f" — exported to {tmp_path / 'export' / 'hf'} (step 12)"
    text = summarize([REC], [], 0.8, "eval/accuracy", "q", export=note)
    assert f"- model: exported to {tmp_path / 'export' / 'hf'} (step 12) (a Hugging Face directory" in text
    failed = summarize([REC], [], 0.8, "eval/accuracy", "q", export={**note, "error": "OSError: full"})
    assert "- model: the export to" in failed and "failed: OSError: full" in failed
    assert "model:" not in summarize([REC], [], 0.8, "eval/accuracy", "q")
    (tmp_path / EXPORT_NOTE).write_text("{half")
    assert read_export_note(tmp_path) is None
