"""What a learner rank is built from: LearnerConfig (plain data, carried in a run config) and the PPO critic."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from rlscale.spec.algorithm import KL_ESTIMATORS, LOSS_AGGREGATIONS
from rlscale.trainer.lr_schedule import lr_factor


@dataclass
class LearnerConfig:
    """Everything a rank needs to build its engines; plain data so it can travel in a run config.
    The algorithm fields mirror spec.algorithm (rlscale/spec/algorithm.py describes each)."""

    model_path: str
    algorithm: str = "grpo"
    dtype: str = "float32"
    zero_stage: int = 1
    micro_batch: int = 32  # most sequences per micro-batch (down to 1: a prompt group may span micro-batches)
    micro_batch_tokens: int | None = None  # most padded tokens per micro-batch, next to micro_batch
    gradient_checkpointing: bool = False  # recompute activations in backward (policy and critic body)
    # Response positions per float32 [chunk, vocab] logits block for log-probs and entropy (trainer/logprobs.py);
    # 0: the full [tokens, vocab] logits at once (the reference computation).
    logprob_chunk: int = 1024
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 0
    lr_schedule: str = "constant"  # trainer/lr_schedule.py
    decay_steps: int | None = None  # the linear or cosine decay's end, in learner steps
    grad_clip: float = 1.0
    clip_ratio: float = 0.2
    clip_ratio_high: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    loss_aggregation: str = "token-mean"
    # The longest response (task.maxNewTokens): Dr. GRPO's normaliser and the overlong penalty's L_max.
    max_response_length: int | None = None
    gamma: float = 1.0
    lam: float = 0.95
    value_coef: float = 0.5
    value_clip: float | None = 0.2  # None: no clip
    std_normalize: bool = True
    turn_discount: float = 1.0  # spec.task.turnDiscount (per-turn credit under a group algorithm)
    drop_uniform_groups: bool = True  # groups whose samples all score the same teach nothing
    mask_truncated: bool = False  # DAPO's overlong filtering: truncated responses leave the loss
    overlong_buffer: int = 0  # DAPO's L_cache; 0: no overlong penalty
    overlong_penalty_factor: float = 1.0
    # Truncated importance sampling: each token's policy loss times min(pi_old / pi_behaviour, is_cap); None: off.
    is_cap: float | None = None
    epochs: int = 1  # passes over each step's batch
    mini_batches: int = 1  # optimiser steps per pass, each over whole prompt groups
    measure_noise: bool = True
    noise_ema: float = 0.9
    seed: int = 0
    # This rank's checkpoint directory, when the ranks may not share one (a volume per rank).
    checkpoint_dir: str | None = None
    extra_ds_config: dict[str, Any] = field(default_factory=dict)
    # spec.lora as peft's LoraConfig arguments (LoRASpec.peft_kwargs()); None: every parameter trains.
    lora: dict[str, Any] | None = None

    def __post_init__(self):
        if self.loss_aggregation not in LOSS_AGGREGATIONS:
            raise ValueError(f"spec.algorithm.lossAggregation: {self.loss_aggregation!r} is not known; use one of "
                             f"{', '.join(LOSS_AGGREGATIONS)}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"spec.algorithm.klEstimator: {self.kl_estimator!r} is not known; use one of "
                             f"{', '.join(KL_ESTIMATORS)}")
        if self.micro_batch < 1 or (self.micro_batch_tokens is not None and self.micro_batch_tokens < 1):
            raise ValueError(f"LearnerConfig: micro_batch {self.micro_batch} and micro_batch_tokens "
                             f"{self.micro_batch_tokens} must be at least 1 (spec.batch.microBatch, microBatchTokens)")
        if self.is_cap is not None and not self.is_cap >= 1:
            raise ValueError(f"spec.algorithm.isCap: {self.is_cap}; use at least 1 (e.g. 2), or leave it unset")
        if self.epochs < 1 or self.mini_batches < 1:
            raise ValueError(f"LearnerConfig: epochs {self.epochs} and mini_batches {self.mini_batches} must be at "
                             "least 1 (spec.algorithm.epochs, miniBatches)")
        lr_factor(self.warmup_steps, self.lr_schedule, self.warmup_steps, self.decay_steps)  # a bad schedule fails here
        needs_length = self.loss_aggregation == "seq-mean-token-sum-norm" or self.overlong_buffer > 0
        if needs_length and not self.max_response_length:
            raise ValueError("LearnerConfig: seq-mean-token-sum-norm and the overlong penalty need "
                             "max_response_length (task.maxNewTokens)")

    @classmethod
    def from_spec(cls, spec, model_path: str, learning_rate: float | None = None, **overrides) -> LearnerConfig:
        """From a validated RLRunSpec (rlscale.spec) and the plan's learning rate."""
        a, o = spec.algorithm, spec.optimizer
        kw = dict(
            model_path=str(model_path),
            algorithm=a.name,
            dtype=spec.model.dtype,
            zero_stage=spec.learner.zero_stage,
            micro_batch=spec.batch.micro_batch,
            micro_batch_tokens=getattr(spec.batch, "micro_batch_tokens", None),
            gradient_checkpointing=bool(getattr(spec.learner, "gradient_checkpointing", False)),
            lr=learning_rate if learning_rate is not None else o.lr,
            betas=tuple(o.betas),
            eps=o.eps,
            weight_decay=o.weight_decay,
            warmup_steps=o.warmup_steps,
            lr_schedule=o.lr_schedule,
            decay_steps=(o.decay_steps or spec.budget.max_steps) if o.lr_schedule != "constant" else None,
            grad_clip=o.grad_clip,
            clip_ratio=a.clip_ratio,
            clip_ratio_high=a.clip_ratio_high,
            kl_coef=a.kl_coef,
            kl_estimator=a.kl_estimator,
            entropy_coef=a.entropy_coef,
            loss_aggregation=a.resolved_loss_aggregation(),
            # Multi-turn: a trajectory's tokens after the prompt (the model's and the observations').
            max_response_length=(spec.task.max_trajectory_tokens or spec.model.max_length)
            if (spec.task.max_turns or 1) > 1 else spec.task.max_new_tokens,
            gamma=a.gamma,
            lam=a.lambda_,
            value_coef=a.value_coef,
            value_clip=a.value_clip or None,
            std_normalize=a.std_normalize,
            turn_discount=spec.task.turn_discount,
            drop_uniform_groups=a.drop_uniform_groups,
            mask_truncated=a.mask_truncated_completions,
            overlong_buffer=a.overlong_buffer.length if a.overlong_buffer else 0,
            overlong_penalty_factor=a.overlong_buffer.penalty_factor if a.overlong_buffer else 1.0,
            is_cap=a.is_cap,
            epochs=a.epochs,
            mini_batches=a.mini_batches,
            lora=spec.lora.peft_kwargs() if getattr(spec, "lora", None) is not None else None,
        )
        kw.update(overrides)
        return cls(**kw)


class ValueModel(torch.nn.Module):
    """PPO critic: the policy's transformer body with a scalar head (zero-initialised)."""

    def __init__(self, model_path: str, dtype: torch.dtype):
        super().__init__()
        from transformers import AutoModel

        self.body = AutoModel.from_pretrained(model_path, dtype=dtype, local_files_only=True)
        self.head = torch.nn.Linear(self.body.config.hidden_size, 1, dtype=dtype)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask):
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.head(hidden).squeeze(-1).float()


def enable_gradient_checkpointing(model) -> None:
    """HF activation checkpointing (non-reentrant) on a model or a ValueModel's body. HF checkpoints only
    in training mode, so the model is put in training mode with every dropout turned off: the learner's
    forward stays the deterministic one it computes in eval mode (the rollout's log-probs are dropout-free)."""
    body = model.body if isinstance(model, ValueModel) else model
    body.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        for attr in ("attention_dropout", "dropout"):
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, 0.0)
