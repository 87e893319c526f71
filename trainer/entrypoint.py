"""`rlscale learner --config FILE`: one DeepSpeed rank; rank 0 drives the run, the others follow."""

from __future__ import annotations

import logging
import os
import sys

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
    from rlscale.trainer.learner import Learner

    learner = Learner(learner_config_from_run(cfg))
    log.info("rank %d of %d ready (ZeRO stage %d)", learner.rank, learner.world_size, learner.config.zero_stage)
    if learner.rank > 0:
        learner.follow()
        return 0
    from rlscale.trainer.driver import drive

    try:
        return drive(cfg, learner)
    finally:
        learner.shutdown()
