"""spec.lora: train low-rank adapters (peft's LoRA) on a frozen base instead of every parameter.

Names follow peft's LoraConfig (r, lora_alpha, lora_dropout, target_modules, modules_to_save) in the
spec's camelCase. With spec.lora the learner wraps the policy with peft and its optimizer holds only
the adapter; the KL reference is the same model with the adapter disabled; checkpoints hold the adapter
and the base's identity; each weight update sends the adapter, not the model (docs/lora.md).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from rlscale.spec.base import PosInt, _Model

# peft's keyword for "every linear layer but the output head" (verl's and TRL's usual LoRA-RL choice).
ALL_LINEAR = "all-linear"
MODULE_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_.]*$"
# The ranks vLLM's LoRA kernels are built for (vllm.config.lora.LoRAConfig's max_lora_rank choices).
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# The learning rate the adapter trains at is the spec's optimizer.lr (scaled with the batch by the same rule);
# LoRA's usual lr is about 10x the full fine-tune's (docs/lora.md): the quickstart's LoRA example says so.
LORA_LR_FACTOR_HINT = 10


class LoRASpec(_Model):
    """Train a LoRA adapter (peft) on the frozen base model; adapters, not whole models, go to the rollout."""

    rank: PosInt = Field(8, description="r: the adapter's rank (peft's default 8). The rollout engines serve it "
                         "with vLLM's LoRA kernels, built for ranks " + ", ".join(map(str, VLLM_RANKS)) + ".")
    alpha: float | None = Field(None, gt=0, le=4096, description="lora_alpha: the update is scaled by alpha / rank. "
                                "Unset: equal to rank (scale 1, as peft's defaults r 8, alpha 8).")
    dropout: float = Field(0.0, ge=0, lt=1, description="lora_dropout on the adapter's input during the learner's "
                           "forward passes (peft's default 0). Above 0 the learner's log-probs are noisy versions "
                           "of the rollout's, so the importance ratio starts away from 1.")
    target_modules: list[str] = Field(
        default_factory=lambda: [ALL_LINEAR], min_length=1, max_length=64,
        description="Modules that get an adapter, by peft's names: [all-linear] (every linear layer but the output "
        "head, the default) or module-name suffixes such as [q_proj, k_proj, v_proj, o_proj].")
    modules_to_save: list[str] = Field(
        default_factory=list, max_length=16,
        description="Modules trained in full beside the adapter (peft's modules_to_save, e.g. [lm_head]); they are "
        "checkpointed with it, and weight updates then send the merged model instead of the adapter.")

    @field_validator("target_modules", "modules_to_save")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        import re

        for n in names:
            if n != ALL_LINEAR and not re.match(MODULE_NAME_RE, n):
                raise ValueError(f"module name {n!r} is not a module name (letters, digits, _ and .); use peft's "
                                 "names, e.g. q_proj")
        if len(set(names)) != len(names):
            raise ValueError(f"{names} names a module twice; name each once")
        return names

    @property
    def scale(self) -> float:
        return (self.alpha if self.alpha is not None else self.rank) / self.rank

    @property
    def all_linear(self) -> bool:
        return ALL_LINEAR in self.target_modules

    def peft_kwargs(self) -> dict:
        """LoraConfig's arguments (plain data: the learner's config carries them)."""
        return {"r": self.rank, "lora_alpha": self.alpha if self.alpha is not None else self.rank,
                "lora_dropout": self.dropout,
                "target_modules": ALL_LINEAR if self.all_linear else list(self.target_modules),
                "modules_to_save": list(self.modules_to_save) or None}
