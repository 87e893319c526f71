"""The driver's two ports: the rollout (vLLM replicas behind Ray Serve) and the learner (DeepSpeed ranks).

rlscale.rollout.serve.RolloutClient and rlscale.trainer.learner.Learner are what a run plugs in;
tests plug in fakes. Only what the loop calls is here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol


class Generated(Protocol):
    """One sampled completion (rlscale.rollout.engine.Sample)."""

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str


class Serving(Protocol):
    """The rollout app as the driver sees it (rlscale.rollout.placement.ServingState)."""

    target: int  # replicas asked of Serve
    running: int  # replicas taking requests
    pods: tuple[str, ...]  # pods hosting a replica (starting, running or draining); empty off Kubernetes


class Rollout(Protocol):
    def generate(self, prompt_token_ids: Sequence[Sequence[int]], samples_per_prompt: int, *, temperature: float,
                 top_p: float, max_new_tokens: int, seed: int | None = None,
                 version: int = 0, top_k: int | None = None, min_p: float | None = None,
                 repetition_penalty: float | None = None) -> list[list[Generated]]:
        """Samples grouped prompt by prompt, generated with weights of at least `version`; top_k, min_p and
        repetition_penalty are passed only when the spec sets them (RolloutSpec.sampling)."""
        ...

    def publish_weights(self, version: int, weights: Any) -> Any:
        """Weights version `version` to every ready replica: `weights` a vLLM WeightSource (the learner's) or
        named tensors; the result says how (rlscale.trainer.transfer.publisher.SyncResult)."""
        ...

    def sleep(self, level: int = 1) -> Any:
        """Colocated: the engines free the accelerator while the learner trains (a no-op on CPU)."""
        ...

    def wake_up(self, tags: list[str] | None = None) -> Any: ...

    def scale(self, num_replicas: int) -> Any:
        """Ask for `num_replicas`: a scale-down returns once the removed replicas drained, a scale-up at
        once (replicas join as they are placed); never raises for replicas that do not come."""
        ...

    def serving(self) -> Serving: ...

    def generation_seconds_total(self) -> float | None: ...


class Learner(Protocol):
    def step(self, batch: Any, lr: float | None = None) -> dict[str, Any]:
        """One optimiser step over a RolloutBatch; stats, with skipped=1.0 when nothing was trained."""
        ...

    def export_weights(self) -> dict[str, Any]: ...

    def save_checkpoint(self, directory: str | Path, state: dict | None = None, keep: int = 2) -> Path | None: ...

    def load_checkpoint(self, directory: str | Path) -> dict | None: ...

    def shutdown(self) -> None: ...
