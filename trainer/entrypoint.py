"""`rlscale learner --config FILE`: one DeepSpeed rank; rank 0 drives the run, the others follow."""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger("rlscale.learner")


def learner_config_from_run(cfg):
    """The LearnerConfig for a resolved run config (spec + plan + model directory)."""
    from rlscale.trainer.builtin import resolve_model_path
    from rlscale.trainer.learner import LearnerConfig

    spec = cfg.parsed_spec()
    model_dir = cfg.model_dir or str(resolve_model_path(spec.model.path, progress=False))
    lr = (cfg.plan or {}).get("learningRate")
    seed = int((cfg.extra or {}).get("seed", 0))
    return LearnerConfig.from_spec(spec, model_dir, learning_rate=lr, seed=seed)


def main(config_path: str | None) -> int:
    """Start this rank's learner; rank 0 runs the driver loop, ranks > 0 serve it until it stops."""
    from rlscale.runconfig import load_run_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s learner %(levelname)s %(message)s", stream=sys.stderr)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/rlscale/torch_extensions"))
    cfg = load_run_config(config_path)
    # Rank 0 deploys the rollout replicas (Serve, vLLM's load) while DeepSpeed starts: one
    # after the other they took 28 s and 45 s of the quickstart's start-up.
    rollout = _Background(_connect_rollout, cfg) if int(os.environ.get("RANK", "0")) == 0 else None
    from rlscale.trainer.learner import Learner

    learner = Learner(learner_config_from_run(cfg))
    log.info("rank %d of %d ready (ZeRO stage %d)", learner.rank, learner.world_size, learner.config.zero_stage)
    if learner.rank > 0:
        learner.follow()
        return 0
    from rlscale.trainer.driver import drive

    try:
        return drive(cfg, learner, rollout.result() if rollout else None)
    finally:
        learner.shutdown()


def _connect_rollout(cfg):
    from rlscale.trainer.driver import connect_rollout

    return connect_rollout(cfg)


class _Background:
    """Run fn(*args) in a daemon thread: a start-up that fails elsewhere does not wait for it."""

    def __init__(self, fn, *args):
        self._value = self._error = None
        self._thread = threading.Thread(target=self._run, args=(fn, *args), name="rollout-deploy", daemon=True)
        self._thread.start()

    def _run(self, fn, *args):
        try:
            self._value = fn(*args)
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
