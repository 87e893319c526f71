"""A learner rank whose checkpoint directory is its own (as with one volume per StatefulSet pod).

Usage: python per_rank_ckpt_worker.py ARGS_JSON (RANK/WORLD_SIZE/MASTER_* in the env). Runs
`steps` fixed GRPO steps from the newest checkpoint, saves one, and dumps its parameters.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from rlscale.trainer.learner import Learner, LearnerConfig


def main(args: dict) -> None:
    rank = int(os.environ["RANK"])
    own = Path(args["root"]) / f"rank{rank}"  # what a per-rank volume looks like from each pod
    learner = Learner(LearnerConfig(**args["config"], checkpoint_dir=str(own)))
    print("PER_RANK", learner.per_rank_checkpoints, flush=True)
    if learner.rank == 0:
        state = learner.load_checkpoint(own)
        start = state["step"] if state else 0
        print("RESUMED_AT", start, flush=True)
        for i in range(start, start + args["steps"]):
            learner.step(args["batches"][i % len(args["batches"])], lr=args["lr"])
        learner.save_checkpoint(own, {"step": start + args["steps"]}, keep=2)
        learner.shutdown()
    else:
        learner.follow()
    torch.save({n: p.detach().clone() for n, p in learner.engine.module.named_parameters()},
               Path(args["out"]) / f"params-{args['tag']}-rank{rank}.pt")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(json.loads(Path(sys.argv[1]).read_text()))
