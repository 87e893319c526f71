"""Learner: algorithms (pure tensor functions), DeepSpeed engine, tasks, rewards, checkpoints.

Modules: algorithms (GRPO/PPO math), learner (DeepSpeed ranks; rank 0 drives), batching
(rollout batches -> micro-batches), noise (gradient noise scale), tasks and rewards
(builtin:arithmetic, exact-match/format/plug-ins), modeling and builtin (config-built
Qwen2 models, builtin:tiny-arith), checkpoint, generation (HF reference sampler),
entrypoint (`rlscale learner`), tools (multi-turn rollouts: tool calls, the sandboxed tool workers,
environments, builtin:tool-arithmetic). Importing this package imports no torch.
"""
