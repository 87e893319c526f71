"""rlscale: batch-size-aware GRPO/PPO for LLMs (torch-free core)."""

__version__ = "0.1.0"
