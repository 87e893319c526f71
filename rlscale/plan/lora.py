"""The planner's LoRA terms (spec.lora): how many parameters the adapter trains and what changes with it.

With LoRA the learner holds the base frozen in the model's dtype (no gradients, no optimizer states) and
trains A adapter parameters (their gradients and Adam's fp32 states); a step's compute is the forward and
the backward through the frozen base to the adapter (about 4P FLOPs a token instead of 6P: no weight
gradients for the base); a weight update moves the adapter (A parameters) instead of the model (P); the
engine keeps one LoRA slot of A parameters beside the base (max_loras 1).
"""

from __future__ import annotations

from typing import Any

# peft's module names of a Llama/Qwen-style decoder layer, and what all-linear covers there.
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
ALL_LINEAR = ATTENTION + MLP
# FLOPs a token through the frozen base, forward and backward to the adapter: 2P forward, 2P for the
# activations' gradients; the weight gradients (another 2P) are the adapter's only.
FROZEN_TRAIN_FLOPS_PER_PARAM = 4.0
# A colocated LoRA engine's share of the GPU while it generates: the learner's states are offloaded and its
# frozen base moved to host memory then (trainer/transfer/ranks.py), so the engine takes most of the card.
COLOCATED_LORA_MEMORY_UTILIZATION = 0.8


def intermediate_size(shape: Any) -> float:
    """The MLP's width: the config's, else from the parameter count (P = embeddings + L x (attention + 3 h I)),
    the head taken as untied, which errs towards a smaller I (fewer adapter parameters) by at most
    vocab x h / (3 h L)."""
    if getattr(shape, "intermediate_size", 0):
        return float(shape.intermediate_size)
    h, layers = float(shape.hidden_size), max(1, shape.layers)
    heads = shape.attention_heads or max(1, round(h / shape.head_dim))
    attn = 2 * h * heads * shape.head_dim + 2 * h * shape.kv_heads * shape.head_dim
    per_layer = (shape.params - 2.0 * shape.vocab_size * h) / layers
    return max(h, (per_layer - attn) / (3 * h))


def module_dims(shape: Any) -> dict[str, tuple[float, float]]:
    """(in, out) features of each linear layer of one decoder layer."""
    h = float(shape.hidden_size)
    heads = shape.attention_heads or max(1, round(h / shape.head_dim))
    q, kv, inter = heads * shape.head_dim, shape.kv_heads * shape.head_dim, intermediate_size(shape)
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}


def adapter_params(shape: Any, lora: Any) -> float:
    """Parameters of spec.lora's adapter on this shape: r (in + out) per targeted linear layer per decoder layer.
    A name outside the Llama/Qwen set is counted as an h x h layer."""
    dims = module_dims(shape)
    names = ALL_LINEAR if lora.all_linear else tuple(lora.target_modules)
    h = float(shape.hidden_size)
    per_layer = sum(sum(dims.get(n.rsplit(".", 1)[-1], (h, h))) for n in names)
    return float(lora.rank) * per_layer * shape.layers


def lora_params_for(spec: Any, shape: Any) -> float:
    """spec.lora's adapter parameters, 0 without spec.lora (every parameter trains)."""
    lora = getattr(spec, "lora", None)
    return adapter_params(shape, lora) if lora is not None else 0.0


def lora_note(spec: Any, shape: Any, dtype_bytes: float) -> str | None:
    """The plan's note on LoRA: what trains, what an update moves, and the learning-rate assumption."""
    lora = getattr(spec, "lora", None)
    if lora is None:
        return None
    a, p = adapter_params(shape, lora), float(shape.params)
    size = f"{p / 1e9:.2g}B" if p >= 1e9 else f"{p / 1e6:.3g}M"
    return (f"LoRA r={lora.rank} on {', '.join(lora.target_modules)}: {a / 1e6:.2f}M adapter parameters "
            f"({100 * a / p:.2f}% of {size}) train; the base stays frozen; each weight "
            f"update sends {a * dtype_bytes / 2**20:.1f} MiB "
            + ("(merged weights instead: lora.modulesToSave is set)" if lora.modules_to_save else "of adapter")
            + "; optimizer.lr is the adapter's (LoRA usually wants about 10x a full fine-tune's lr)")


def lora_fix(spec: Any, plan: Any) -> str:
    """Where a full fine-tune does not fit, whether training a LoRA adapter would: `plan(trial)` (the decision's
    make_plan with the caller's arguments) on the same spec with spec.lora at its defaults; said as the fix."""
    from rlscale.plan.errors import PlanError
    from rlscale.spec.lora import LoRASpec

    if getattr(spec, "lora", None) is not None:
        return ""
    trial = spec.model_copy(deep=True)
    trial.lora = LoRASpec()
    zero = ""
    if trial.learner.zero_stage == 3:  # spec.lora needs ZeRO 0-2
        trial.learner.zero_stage, zero = 1, " and learner.zeroStage 1"
    try:
        fits = plan(trial)
    except PlanError:
        return ""
    return (f"; or train a LoRA adapter instead of every parameter: with spec.lora{zero} (rank 8, all-linear; the "
            f"base frozen, no optimizer states for it) the same spec fits ({fits.placement}, "
            f"{fits.learner_replicas} learner replica(s) on {fits.gpus} GPU(s)); raise optimizer.lr about 10x")
