"""Rollout: vLLM engine, Ray Serve deployment, in-place weight loading.

- `rlscale.rollout.engine`: `RolloutEngine` (one in-process vLLM `LLM`), `EngineConfig`,
  `Sample` (token ids, raw-model logprobs, finish reason, weights version).
- `rlscale.rollout.serve`: `RolloutClient` (deploy, scale, publish_weights, generate),
  `RolloutOptions`, the Serve replica and the weight-store actor.
- `rlscale.rollout.entrypoint`: `rlscale rollout --config FILE` (a Ray worker offering
  one `rollout` slot).
- `rlscale.rollout.metrics`: the replica's `rlscale_rollout_*` Prometheus metrics.

Nothing is imported here: the core and the operator may import this package's name
without pulling in torch, vLLM or Ray.
"""
