"""A ZeRO-3 learner rank that trains a few fixed steps, checkpoints into a directory of its own (as
with one volume per pod) and, on rank 0, saves the weights the rollout engines would receive.

Usage: python export_worker.py ARGS_JSON (RANK/WORLD_SIZE/MASTER_* in the env)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from rlscale.trainer.learner import Learner, LearnerConfig


def main(args: dict) -> None:
    rank = int(os.environ["RANK"])
    own = Path(args["root"]) / f"rank{rank}"
    learner = Learner(LearnerConfig(**args["config"], checkpoint_dir=str(own)))
    if learner.rank == 0:
        for b in args["batches"]:
            learner.step(b, lr=args["lr"])
        learner.save_checkpoint(own, {"step": len(args["batches"])}, keep=2)
        weights = learner.export_weights()
        learner.shutdown()
        torch.save(weights, Path(args["out"]) / "published.pt")
    else:
        learner.follow()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(json.loads(Path(sys.argv[1]).read_text()))
