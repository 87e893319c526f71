"""spec.algorithm: the RL algorithm family and its loss knobs (docs/algorithms.md has each formula).

Names follow what TRL's and verl's users write: the algorithms as verl's adv_estimator and TRL's
trainers name them, the loss aggregation modes as verl's loss_agg_mode, DAPO's parts as verl's
overlong_buffer and filter_groups and TRL's mask_truncated_completions.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlscale.spec.base import PosInt, _Model

ALGORITHMS = ("grpo", "ppo", "rloo", "reinforce++", "reinforce++-baseline", "gspo")
# The algorithms whose advantage compares a sample with the other samples of its prompt.
GROUP_ALGORITHMS = ("grpo", "gspo", "rloo", "reinforce++-baseline")
# Those whose reference KL is a per-token reward penalty (k1) rather than a loss term.
KL_IN_REWARD = ("ppo", "reinforce++")
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")
# Defaults that the rules compare with: a knob an algorithm does not use must keep its default.
DEFAULT_GAMMA, DEFAULT_LAMBDA, DEFAULT_VALUE_COEF, DEFAULT_VALUE_CLIP = 1.0, 0.95, 0.5, 0.2
DEFAULT_KL_ESTIMATOR = "k3"
DEFAULT_MAX_ROUNDS = 4
MAX_STALENESS = 8


def default_loss_aggregation(name: str) -> str:
    """lossAggregation when unset: GSPO's paper averages over sequences; the rest follow verl's default."""
    return "seq-mean-token-mean" if name == "gspo" else "token-mean"


class OverlongBufferSpec(_Model):
    """DAPO's soft overlong punishment (verl's overlong_buffer), a penalty added to long responses' rewards.

    A response of n tokens within the last `length` tokens before task.maxNewTokens gets
    penaltyFactor x ((maxNewTokens - length) - n) / length, down to -penaltyFactor at maxNewTokens.
    """

    length: PosInt = Field(description="L_cache: the last tokens before task.maxNewTokens over which the penalty "
                           "grows linearly from 0 to -penaltyFactor; smaller than task.maxNewTokens.")
    penalty_factor: float = Field(1.0, gt=0, le=100, description="The penalty of a response of task.maxNewTokens "
                                  "tokens.")


class DynamicSamplingSpec(_Model):
    """DAPO's dynamic sampling (verl's filter_groups): generate until the step holds enough mixed groups.

    Further generation rounds run until the step holds batch.prompts groups whose rewards are not
    all equal; only those are trained.
    """

    enabled: bool = Field(False, description="Oversample: generate further rounds until the step has batch.prompts "
                          "groups with mixed rewards (the others are dropped); every generated sample counts in the "
                          "run's samples and budget.maxSamples.")
    max_rounds: PosInt = Field(DEFAULT_MAX_ROUNDS, le=64, description="Most generation rounds per step, the first "
                               "included (verl's max_num_gen_batches); past it the step trains on the mixed groups "
                               "it has.")


class AlgorithmSpec(_Model):
    """The RL algorithm and its loss coefficients."""

    name: Literal[ALGORITHMS] = Field(  # type: ignore[valid-type]
        "grpo", description="grpo (group-normalised advantages), rloo (leave-one-out baseline), reinforce++ "
        "(returns whitened over the batch, KL in the reward), reinforce++-baseline (group-mean baseline, then "
        "whitened over the batch), gspo (GRPO's advantages with a sequence-level ratio), all without a critic; "
        "or ppo (critic + GAE). docs/algorithms.md gives each formula.")
    clip_ratio: float = Field(0.2, gt=0, le=10, description="PPO-style ratio clip epsilon (lower side, and upper "
                              "unless clipRatioHigh is set); gspo clips its sequence ratio with it.")
    clip_ratio_high: float | None = Field(None, gt=0, le=10, description="Upper clip epsilon for asymmetric clipping; "
                                          "defaults to clipRatio.")
    kl_coef: float = Field(0.0, ge=0, description="Coefficient of the KL penalty to the frozen reference policy; 0 "
                           "disables the reference model.")
    kl_estimator: Literal[KL_ESTIMATORS] = Field(  # type: ignore[valid-type]
        DEFAULT_KL_ESTIMATOR, description="Per-token estimator of the KL from the policy to the reference in the "
        "loss term of grpo, gspo, rloo and reinforce++-baseline, with x = log policy - log reference: k1 = x, k2 = "
        "x^2 / 2, k3 = "
        "exp(-x) - 1 + x (verl's low_var_kl). Needs klCoef > 0; ppo and reinforce++ put the KL in the reward as "
        "k1.")
    entropy_coef: float = Field(0.0, ge=0, le=1, description="Entropy bonus: the loss subtracts entropyCoef x the "
                                "policy's token entropy (aggregated as lossAggregation); 0 turns it off.")
    loss_aggregation: Literal[LOSS_AGGREGATIONS] | None = Field(  # type: ignore[valid-type]
        None, description="How per-token losses become the step's loss (verl's loss_agg_mode): token-mean (every "
        "token of the batch weighs the same; TRL's dapo), seq-mean-token-mean (each response's token mean, then "
        "the mean over responses; TRL's grpo), seq-mean-token-sum-norm (Dr. GRPO: the token sum divided by "
        "responses x task.maxNewTokens; TRL's dr_grpo). Unset: seq-mean-token-mean for gspo, token-mean otherwise.")
    gamma: float = Field(DEFAULT_GAMMA, ge=0, le=1, description="Discount factor (ppo's GAE, reinforce++'s returns).")
    lambda_: float = Field(DEFAULT_LAMBDA, ge=0, le=1, alias="lambda", description="GAE lambda (ppo).")
    value_coef: float = Field(DEFAULT_VALUE_COEF, ge=0, description="Weight of the value loss (ppo).")
    value_clip: float = Field(DEFAULT_VALUE_CLIP, ge=0, description="ppo: how far the value may move from the "
                              "old value before its loss is clipped; 0 turns the clip off.")
    std_normalize: bool = Field(True, description="grpo and gspo: divide group-centred rewards by the group standard "
                                "deviation (false: Dr. GRPO's unnormalised advantage).")
    drop_uniform_groups: bool = Field(True, description="grpo, gspo, rloo, reinforce++-baseline: leave groups whose "
                                      "rewards are all equal (advantage 0) out of the step, and so out of every "
                                      "normaliser, KL and entropy term; false keeps them, as TRL and verl do.")
    mask_truncated_completions: bool = Field(False, description="DAPO's overlong filtering (TRL's name): responses "
                                             "cut at task.maxNewTokens leave the loss; their rewards still count in "
                                             "their group's baseline.")
    overlong_buffer: OverlongBufferSpec | None = Field(None, description=OverlongBufferSpec.__doc__.split("\n")[0]
                                                       + " Unset: no penalty.")
    dynamic_sampling: DynamicSamplingSpec = Field(default_factory=DynamicSamplingSpec,
                                                  description=DynamicSamplingSpec.__doc__.split("\n")[0])
    max_staleness: int = Field(0, ge=0, le=MAX_STALENESS, strict=True, description="Bounded staleness: the most "
                               "steps the rollout may generate ahead of the learner, so a sample generated with "
                               "weights v trains at version v + maxStaleness at the latest and never later; 0 is the "
                               "synchronous loop (generate, train, publish). The plan chooses the staleness within "
                               "[0, maxStaleness] by predicted time-to-target and says why; disaggregated placement "
                               "only (colocated engines share the learner's accelerators).")
    is_cap: float | None = Field(None, ge=1, le=100, description="Truncated importance sampling: each token's loss "
                                 "is weighted by min(pi_old / pi_behaviour, isCap), pi_behaviour the engine's "
                                 "probability as generated and pi_old the learner's before this batch's first "
                                 "update (verl's and TIS's cap, e.g. 2). Unset: no weight (the samples train as if "
                                 "generated by pi_old).")
    epochs: PosInt = Field(1, le=32, description="Passes over each step's batch (TRL's num_iterations, verl's "
                           "ppo_epochs); past the first, the ratio to pi_old moves and clipRatio acts.")
    mini_batches: PosInt = Field(1, le=1024, description="Optimiser steps per pass: the batch's prompt groups split "
                                 "into this many mini-batches (verl's ppo_mini_batch_size = prompts / miniBatches); "
                                 "at most batch.minPrompts.")

    def resolved_loss_aggregation(self) -> str:
        """lossAggregation, or the algorithm's default when unset."""
        return self.loss_aggregation or default_loss_aggregation(self.name)
