"""Learner: algorithms, DeepSpeed engine, tasks, rewards, checkpoints."""
