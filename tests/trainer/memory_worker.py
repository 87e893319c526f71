"""Learner ranks for tests/trainer/test_learner_memory.py, each its own process (DeepSpeed owns the
process group). Usage: python memory_worker.py MODE ARGS_JSON, with RANK/WORLD_SIZE/MASTER_* in the env.

Modes: `grads` (one learner per config, one step on the same batch each: the loss and the gradient
the optimiser saw, saved per config), `zero` (steps at a ZeRO stage on several ranks, then the weights
streamed, exported and an early-closed iteration; rank 0 prints JSON lines).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from rlscale.trainer.learner import Learner, LearnerConfig


def grads(args: dict) -> None:
    out = {}
    for tag, config in args["configs"].items():
        learner = Learner(LearnerConfig(**config))
        params = list(learner.engine.module.named_parameters())
        seen: dict[str, torch.Tensor] = {}

        def capture(*_, params=params, seen=seen):
            # ZeRO 0, float32: the plain torch optimiser; p.grad is the whole batch's gradient here.
            seen.update({n: p.grad.detach().clone() for n, p in params if p.grad is not None})

        learner.engine.optimizer.register_step_pre_hook(capture)
        stats = learner.step(args["batch"], lr=config["lr"])
        out[tag] = {"stats": stats, "grads": seen}
        del learner
    torch.save(out, Path(args["out"]) / "grads.pt")


def zero(args: dict) -> None:
    learner = Learner(LearnerConfig(**args["config"]))
    if learner.rank != 0:
        print("FOLLOWED", learner.follow(), flush=True)
        return
    for batch in args["batches"]:
        stats = learner.step(batch)
        norms = getattr(learner, "_noise_norms", None)
        print("STATS", json.dumps({**stats, "noise_norms": norms}), flush=True)
    streamed: dict[str, torch.Tensor] = {}
    nbytes = learner.stream_weights(lambda n, t: streamed.__setitem__(n, t), dtype="float64",
                                    bucket_bytes=args.get("bucket_bytes", 1))
    it = learner.iter_weights()
    first = next(it)
    it.close()  # stopped early: the followers must still finish the loop
    exported = learner.export_weights()
    names = [n for n, _ in learner.engine.module.named_parameters()]
    same = all(torch.equal(streamed[n], exported[n].double()) for n in names)
    print("WEIGHTS", json.dumps({"names": sorted(streamed) == sorted(exported) == sorted(names),
                                 "same": same, "dtype": str(streamed[names[0]].dtype), "bytes": nbytes,
                                 "first": first[0], "shapes": {n: list(t.shape) for n, t in exported.items()}}),
          flush=True)
    learner.shutdown()


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("WORKER_THREADS", "1")))
    mode, args_json = sys.argv[1], sys.argv[2]
    {"grads": grads, "zero": zero}[mode](json.loads(Path(args_json).read_text()))
