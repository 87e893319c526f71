"""The errors a reward raises (trainer/rewards.py re-exports them; trainer/reward_model.py raises them too)."""

from __future__ import annotations


class RewardWorkerKilled(RuntimeError):
    """A reward worker killed by a signal mid-call (the OOM killer's SIGKILL, say), or a reward model's replicas
    lost: a fault of the run's processes, not of the reward's code, so the run restarts from its checkpoint rather
    than failing."""


class RewardError(ValueError):
    """A reward that cannot be computed: it names the reward, the prompt and the completion, and the fix."""
