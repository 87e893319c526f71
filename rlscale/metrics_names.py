"""Prometheus metric names, in one place (rlscale_ prefix, base units, _total on counters)."""

PREFIX = "rlscale_"

# The run (driver / embedded runner)
SAMPLES_TOTAL = "rlscale_samples_total"
STEPS_TOTAL = "rlscale_steps_total"
GENERATED_TOKENS_TOTAL = "rlscale_generated_tokens_total"
TRAINED_TOKENS_TOTAL = "rlscale_trained_tokens_total"
STEP_PHASE_SECONDS = "rlscale_step_phase_seconds"  # histogram, label phase
PHASES = ("generate", "reward", "train", "sync")
SAMPLES_PER_SECOND = "rlscale_samples_per_second"
REWARD_MEAN = "rlscale_reward_mean"
REWARD_TERM_MEAN = "rlscale_reward_term_mean"  # gauge, label term: each term of task.reward, unweighted
REWARD_TIMEOUTS_TOTAL = "rlscale_reward_timeouts_total"  # reward calls killed at task.rewardTimeout
# Multi-turn rollouts (spec.task.tools / environment; StepRecord.tools)
TOOL_CALLS_TOTAL = "rlscale_tool_calls_total"  # tool calls made by the trajectories of trained steps
TOOL_ERRORS_TOTAL = "rlscale_tool_errors_total"  # calls that failed: malformed, raised, timed out or killed
TOOL_SECONDS_TOTAL = "rlscale_tool_seconds_total"  # seconds spent in tool calls (summed over calls)
TRUNCATED_TRAJECTORIES_TOTAL = "rlscale_truncated_trajectories_total"  # cut by tokens, budget or maxTurns
TURNS_PER_TRAJECTORY = "rlscale_turns_per_trajectory"  # gauge: mean model turns in the last step
TARGET_METRIC = "rlscale_target_metric"
TARGET_VALUE = "rlscale_target_value"
TIME_TO_TARGET_SECONDS = "rlscale_time_to_target_seconds"
SAMPLES_TO_TARGET = "rlscale_samples_to_target"
PLANNED_PROMPTS = "rlscale_planned_prompts"
PLANNED_SAMPLES_PER_PROMPT = "rlscale_planned_samples_per_prompt"
PLANNED_LEARNING_RATE = "rlscale_planned_learning_rate"
REPLICAS = "rlscale_replicas"  # gauge, label role=rollout|learner
GRADIENT_NOISE_SCALE = "rlscale_gradient_noise_scale"
WEIGHTS_VERSION = "rlscale_weights_version"
PREDICTED_STEP_SECONDS = "rlscale_predicted_step_seconds"

# Step diagnostics, what a run that does not learn is read by first; gauges of the last trained step.
MIXED_REWARD_GROUPS_RATIO = "rlscale_mixed_reward_groups_ratio"  # groups whose rewards differ: GRPO trains on them
POLICY_ENTROPY_NATS = "rlscale_policy_entropy_nats"  # learner's mean token entropy on the sampled responses
CLIPPED_TOKENS_RATIO = "rlscale_clipped_tokens_ratio"  # learner/rollout ratio outside the PPO clip range
GRADIENT_NORM = "rlscale_gradient_norm"  # global L2 norm before clipping
LOGPROB_DIFF_NATS = "rlscale_logprob_diff_nats"  # rollout minus learner log-prob, mean per token
LOGPROB_ABS_DIFF_NATS = "rlscale_logprob_abs_diff_nats"  # |rollout minus learner|, mean per token
# metrics.jsonl key -> gauge; the one map the driver, the live view, /metrics and the report follow.
DIAGNOSTICS = {
    "mixed_group_fraction": MIXED_REWARD_GROUPS_RATIO,
    "entropy": POLICY_ENTROPY_NATS,
    "clip_fraction": CLIPPED_TOKENS_RATIO,
    "grad_norm": GRADIENT_NORM,
    "logprob_diff": LOGPROB_DIFF_NATS,
    "logprob_abs_diff": LOGPROB_ABS_DIFF_NATS,
}
DIAGNOSTIC_KEYS = tuple(DIAGNOSTICS)

# Rollout replicas use the rlscale_rollout_ prefix; the operator rlscale_operator_.
ROLLOUT_PREFIX = "rlscale_rollout_"
OPERATOR_PREFIX = "rlscale_operator_"

DEFAULT_METRICS_PORT = 9400
OPERATOR_METRICS_PORT = 8080
