"""The reward expression's reward-model term: task.rewardModel scored by Ray Serve replicas (rollout/reward_model.py).

The term deploys the replicas on its first call, into the Ray cluster the calling process has joined (the driver,
learner rank 0, has joined the run's), pinned to that process's node, and sends every pair of a call to them in
chunks of batchSize. The driver's first call is its check of the reward on the first rows, at start; the
replicas end with the run (Reward.close). Built without the spec (the driver's resolve_reward call), the term
reads task.rewardModel from the run config that RLSCALE_CONFIG names, as every role reads its config.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlscale.spec import MISSING, FieldError, RewardModelSpec
from rlscale.trainer.reward_errors import RewardError, RewardWorkerKilled

log = logging.getLogger(__name__)

PATH_FIELD = "spec.task.rewardModel.path"
HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name, as the policy's model.path takes it


def reward_model_dir(path: str) -> Path:
    """The local directory of task.rewardModel.path: the directory itself, or a hub id's snapshot in the Hugging
    Face cache (never downloaded); ValueError naming the field and the fix."""
    local = Path(path).expanduser()
    if (local / "config.json").is_file():
        return local
    if HUB_ID_RE.match(path) and not local.is_absolute() and not local.exists():
        from huggingface_hub import snapshot_download
        from huggingface_hub.constants import HF_HUB_CACHE
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            return Path(snapshot_download(path, local_files_only=True))
        except LocalEntryNotFoundError:
            raise ValueError(f"{PATH_FIELD}: {path!r} is not in the Hugging Face cache at {HF_HUB_CACHE}; put it "
                             "there (hf download into HF_HOME, or into the model volume's /models/hf on "
                             "Kubernetes): a reward model is never downloaded at run time") from None
    raise ValueError(f"{PATH_FIELD}: {path!r} is not a directory with a config.json; name a sequence-classification "
                     "model directory in Hugging Face format, or a hub id in the Hugging Face cache")


def check_reward_model(spec: Any) -> list[FieldError]:
    """`rlscale validate`'s check of task.rewardModel, from its files alone: the path resolves here to a
    sequence-classification model of 1 or 2 labels with a tokenizer. A path this machine does not have, in a
    spec with model.volume (a Kubernetes run), is left to the driver, which checks it when it deploys."""
    rm = getattr(spec.task, "reward_model", None)
    if rm is None:
        return []
    from rlscale.rollout.reward_model import config_problem

    try:
        model_dir = reward_model_dir(rm.path)
    except ValueError as exc:
        if spec.model.volume is not None:
            return []
        problem, _, fix = str(exc).removeprefix(f"{PATH_FIELD}: {rm.path!r} ").rpartition("; ")
        return [FieldError(PATH_FIELD, rm.path, problem, fix)]
    problem = config_problem(model_dir)
    if problem is None:
        return []
    return [FieldError(PATH_FIELD, rm.path, f"({model_dir}) {problem}", "name a ...ForSequenceClassification model "
                       "of 1 label (its logit is the score) or 2 labels, with its tokenizer")]


def _spec_from_run_config() -> RewardModelSpec:
    from rlscale.runconfig import load_run_config
    from rlscale.spec import SpecError

    try:
        rm = load_run_config().spec.task.reward_model
    except SpecError as exc:
        raise RewardError(f"reward-model: task.rewardModel was not given and the run config cannot be read "
                          f"({exc.errors[0] if exc.errors else exc}); pass reward_model to resolve_reward") from None
    if rm is None:
        raise RewardError(str(FieldError("spec.task.rewardModel", MISSING, "is unset in the run config, but "
                                         "task.reward has a reward-model term", "set task.rewardModel.path")))
    return rm


class ServedRewardModel:
    """The term's scorer: (prompts, completions) -> one float each, from the replicas it deploys on first use."""

    def __init__(self, spec: RewardModelSpec | None = None):
        self.spec = spec
        self.client: Any = None  # rlscale.rollout.reward_model.RewardModelClient, once deployed

    def __call__(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        import ray

        if self.client is None:
            self.client = self._deploy()
        try:
            return self.client.score(prompts, completions)
        except ray.exceptions.RayTaskError as exc:  # the replica's own code raised: the same input would again
            raise RewardError(f"reward-model ({self.spec.path}) failed on a batch: {exc}; check that the model "
                              "and its tokenizer load and run with transformers") from None
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                TimeoutError) as exc:  # lost replicas: the run restarts from its checkpoint
            raise RewardWorkerKilled(f"reward-model ({self.spec.path}): its replicas were lost or did not answer "
                                     f"({exc.__class__.__name__}: {exc})") from None

    def _deploy(self) -> Any:
        import ray

        from rlscale.rollout.reward_model import RewardModelClient, RewardModelOptions
        from rlscale.trainer.reward_pool import default_workers

        if not ray.is_initialized():
            raise RewardError("reward-model: its replicas are served by the run's Ray cluster, which this process "
                              "has not joined; score it in the driver (the run), or join Ray first (ray.init)")
        self.spec = self.spec or _spec_from_run_config()
        rm = self.spec
        try:
            model_dir = reward_model_dir(rm.path)
        except ValueError as exc:
            raise RewardError(str(exc)) from None
        namespace = ray.get_runtime_context().namespace or ""
        options = RewardModelOptions(app_name=f"reward-model-{namespace.removeprefix('rlscale-') or 'run'}",
                                     num_replicas=rm.replicas, batch_size=rm.batch_size, max_length=rm.max_length,
                                     threads=max(1, default_workers() // rm.replicas))
        try:
            client = RewardModelClient.deploy(str(model_dir), options)
        except RuntimeError as exc:
            raise RewardError(f"{PATH_FIELD}: {rm.path!r}: {exc}") from None
        log.info("reward model %s (%s): %d replica(s), %d torch threads each, batches of %d", rm.path, model_dir,
                 rm.replicas, options.threads, rm.batch_size)
        return client

    def close(self) -> None:
        """Delete the replicas (the run's end); a later call deploys them again."""
        if self.client is not None:
            try:
                self.client.shutdown()
            except Exception as exc:  # Ray may already be gone at the run's end
                log.info("reward model: could not delete its application (%s)", exc)
            self.client = None
