"""A learner rank that trains a few fixed steps, then ends the run as the driver does with spec.export.hf:
rank 0 calls the export sink's end() while the other ranks follow; then every rank takes part in one more
gather (export_weights), which hangs if the export left the followers out of step.

Usage: python export_sink_worker.py ARGS_JSON (RANK/WORLD_SIZE/MASTER_* in the env). Rank 0 saves
published.pt (the weights before the export), after.pt (after it) and told.json (what the sink told)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from rlscale.records import StepRecord
from rlscale.roles import RunEnd
from rlscale.trainer.export_sink import HfExportSink, export_dir
from rlscale.trainer.learner import Learner, LearnerConfig


class Told:
    def __init__(self):
        self.notes = []

    def exported(self, note):
        self.notes.append(note)


def main(args: dict) -> None:
    learner = Learner(LearnerConfig(**args["config"]))
    if learner.rank > 0:
        learner.follow()
        return
    out = Path(args["out"])
    for b in args["batches"]:
        learner.step(b, lr=args["lr"])
    torch.save(learner.export_weights(), out / "published.pt")
    told = Told()
    run_dir = out / "run"
    sink = HfExportSink(learner, args["config"]["model_path"], export_dir(run_dir, in_pod=False),
                        args["config"].get("dtype", "float32"), run_dir, notify=[told])
    sink.end(RunEnd.TARGET, [StepRecord(step=len(args["batches"]))], True)
    torch.save(learner.export_weights(), out / "after.pt")
    learner.shutdown()
    (out / "told.json").write_text(json.dumps(told.notes))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(json.loads(Path(sys.argv[1]).read_text()))
