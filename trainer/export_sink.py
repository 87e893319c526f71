"""spec.export.hf: the learner's final weights as a Hugging Face model directory when the run finishes.

The run finishes when it reaches its target or spends its budget (RunEnd.TARGET, RunEnd.BUDGET). An
interrupted run (a stop, a suspend, a pod's SIGTERM) exports nothing: it resumes from its checkpoint,
and its grace period covers one step and a checkpoint, not an export.

The directory goes beside the run report: the run directory's export/hf with `rlscale run`,
<checkpoint.path>/export/hf in a pod (whose report is <checkpoint.path>/report). It is written from
the learner's iter_weights after the driver's final checkpoint, one parameter (bucket) at a time, every
learner rank taking part in the ZeRO-3 gathers (rank 0 tells the followers in its command protocol),
into a directory beside it that replaces export/hf only once complete (export_hf.atomic_dir). A
failed export is logged and reported (the report's export.json, the sinks told through `exported`,
the RLRun's status); the run's outcome stands.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rlscale.progress_report import MESSAGE_MAX, export_words
from rlscale.records import StepRecord
from rlscale.report import EXPORT_NOTE
from rlscale.roles import RunEnd
from rlscale.trainer.export_hf import atomic_dir, save_hf, write_marker
from rlscale.trainer.sinks import EndSink

log = logging.getLogger("rlscale.driver")

EXPORT_DIR = Path("export") / "hf"


def export_dir(report_dir: str | Path, in_pod: bool) -> Path:
    """Where the run's end writes the model: beside the report. In a pod the report is
    <checkpoint.path>/report, so <checkpoint.path>/export/hf; locally the report is the run directory."""
    report_dir = Path(report_dir)
    return (report_dir.parent if in_pod else report_dir) / EXPORT_DIR


class HfExportSink(EndSink):
    """At a finished run's end (after the final checkpoint, before the sinks that report the end), write
    `out` from the learner's weights and tell `notify`'s sinks that have an `exported(export)` method."""

    def __init__(self, learner: Any, model_dir: str | Path, out: str | Path, dtype: str, report_dir: str | Path,
                 *, pod: str | None = None, notify: Sequence[Any] = ()):
        self.learner, self.model_dir, self.out, self.dtype = learner, Path(model_dir), Path(out), dtype
        self.report_dir, self.pod, self.notify = Path(report_dir), pod, list(notify)
        self.result: dict[str, Any] | None = None  # the last export's note (ProgressReport.export)

    def end(self, end: RunEnd, history: Sequence[StepRecord], target_reached: bool) -> None:
        if end.outcome is None:
            log.info("spec.export.hf: the run was interrupted, so nothing is exported; the export is written "
                     "when it finishes (or now: `rlscale export RUN --hf OUT` from its checkpoint)")
            return
        self.result = self.export(history[-1].step if history else None)
        try:
            self.report_dir.mkdir(parents=True, exist_ok=True)
            (self.report_dir / EXPORT_NOTE).write_text(json.dumps(self.result, indent=1) + "\n")
        except OSError:
            log.exception("writing %s in %s failed", EXPORT_NOTE, self.report_dir)
        for sink in self.notify:
            told = getattr(sink, "exported", None)
            if told is not None:
                told(self.result)

    def export(self, step: int | None) -> dict[str, Any]:
        """Write the directory; returns its note: path (and pod), step and seconds, or the error. Never
        raises an Exception: the run has finished whatever happens here."""
        note: dict[str, Any] = {"path": str(self.out.resolve())}
        if self.pod:
            note["pod"] = self.pod
        if step is not None:
            note["step"] = int(step)
        t0 = time.perf_counter()
        try:
            parameters = self._write(step)
        except Exception as exc:
            log.exception("spec.export.hf: writing %s failed; the run's outcome stands", self.out)
            note["error"] = f"{type(exc).__name__}: {exc}"[-MESSAGE_MAX:]
            return note
        note["seconds"] = round(time.perf_counter() - t0, 2)
        log.info("%s: %s parameters, %s, in %.1f s", export_words(note), f"{parameters:,}", self.dtype,
                 note["seconds"])
        return note

    def _write(self, step: int | None) -> int:
        """save_hf from the learner's weights into a directory that replaces `out` once complete; returns
        the number of values written."""
        counted = [0]
        with atomic_dir(self.out) as tmp:
            weights = _weights(self.learner)
            try:
                save_hf(_counting(weights, counted), self.model_dir, tmp, self.dtype,
                        source=f"the learner's weights at step {step}")
            finally:
                close = getattr(weights, "close", None)
                if close is not None:  # an unfinished iter_weights still runs its gathers so the followers finish
                    close()
            write_marker(tmp, {"source": "learner", "step": step, "dtype": self.dtype, "parameters": counted[0],
                               "zeroStage": getattr(getattr(self.learner, "config", None), "zero_stage", None)})
        return counted[0]


def _weights(learner: Any) -> Iterator[tuple[str, Any]]:
    """The learner's weights as (name, tensor) pairs on the CPU: iter_weights where it has it (rank 0;
    nothing is gathered until the first pair is asked for), else export_weights."""
    it = getattr(learner, "iter_weights", None)
    return it() if it is not None else iter(learner.export_weights().items())


def _counting(pairs: Iterator[tuple[str, Any]], counted: list[int]) -> Iterator[tuple[str, Any]]:
    for name, tensor in pairs:
        counted[0] += int(tensor.numel())
        yield name, tensor


def export_sinks(cfg: Any, learner: Any, run_dir: str | Path, notify: Sequence[Any] = ()) -> list[Any]:
    """The sinks spec.export.hf asks for (none when false), for Driver.from_config: put them before the
    run log and the sinks that report the end, and pass those as `notify` (they hear of the export
    through `exported(note)`). `cfg`: the RunConfig; `run_dir`: the report directory."""
    spec = cfg.spec
    if not spec.export.hf:
        return []
    model_dir = cfg.model_dir or getattr(getattr(learner, "config", None), "model_path", None) or spec.model.path
    in_pod = cfg.local is None
    return [HfExportSink(learner, model_dir, export_dir(run_dir, in_pod), spec.model.dtype, run_dir,
                         pod=os.environ.get("POD_NAME") if in_pod else None, notify=notify)]
