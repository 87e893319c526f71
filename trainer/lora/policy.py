"""The policy as peft's LoRA model: building it from spec.lora, its adapter (what trains, is checkpointed and
is sent to the engines) and its merged weights under the base model's own names (export, merged sync).

The learner keeps the model in eval mode (its log-probs must match the rollout's, which has no dropout), so
peft's lora_dropout modules alone are put in training mode when spec.lora.dropout > 0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

ADAPTER = "default"  # peft's name of the one adapter a PeftModel gets


def wrap(model: Any, lora: dict[str, Any]) -> Any:
    """`model` (a transformers causal LM, or a critic's body) with a fresh LoRA adapter: only the adapter (and
    modules_to_save) requires grad. `lora` is LoRASpec.peft_kwargs()."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(**lora)
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        raise ValueError(f"spec.lora.targetModules: {lora.get('target_modules')!r} does not match the model's "
                         f"modules ({exc}); use [all-linear] or names of its linear layers, e.g. q_proj, "
                         "v_proj") from exc
    if lora.get("lora_dropout"):
        for name, m in peft_model.named_modules():
            if name.endswith(f"lora_dropout.{ADAPTER}"):
                m.train()
    return peft_model


def trainable(model: Any) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def adapter_state(peft_model: Any) -> dict[str, torch.Tensor]:
    """The adapter as peft saves it (adapter_model.safetensors' names: base_model.model.<module>.lora_A.weight,
    and modules_to_save under their module's name), detached views of the live parameters."""
    from peft.utils import get_peft_model_state_dict

    return {k: v.detach() for k, v in get_peft_model_state_dict(peft_model, adapter_name=ADAPTER).items()}


def adapter_config(peft_model: Any) -> dict[str, Any]:
    """adapter_config.json's contents, with all-linear resolved to the module names peft chose (vLLM reads
    target_modules)."""
    cfg = peft_model.peft_config[ADAPTER].to_dict()
    for k, v in list(cfg.items()):
        if isinstance(v, set):
            cfg[k] = sorted(v)
    return cfg


def _lora_layers(base: Any) -> dict[str, Any]:
    from peft.tuners.lora import LoraLayer

    return {n: m for n, m in base.named_modules() if isinstance(m, LoraLayer) and ADAPTER in m.lora_A}


def merged_items(peft_model: Any, dtype: torch.dtype | None = None, device: str = "cpu"
                 ) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight of the base model under its own (transformers) names, the adapter merged in (W + scale B A)
    and modules_to_save's trained copies in place of the originals; the model is not changed. Tied weights
    come once, as named_parameters() gives them."""
    base = peft_model.get_base_model()
    layers = _lora_layers(base)
    with torch.no_grad():
        for name, p in base.named_parameters():
            if ".lora_" in name or ".original_module." in name:
                continue
            out = name.replace(f".modules_to_save.{ADAPTER}.", ".")
            t = p.detach()
            if ".base_layer." in name:
                module = name[: name.index(".base_layer.")]
                out = name.replace(".base_layer.", ".")
                if name.endswith("weight") and module in layers:
                    t = t + layers[module].get_delta_weight(ADAPTER).to(t.dtype)
            yield out, t.to(device=device, dtype=dtype or t.dtype, copy=True)


@contextlib.contextmanager
def adapter_off(peft_model: Any):
    """The base model's forward: the KL reference with no second copy of the model."""
    with peft_model.disable_adapter():
        yield


class Reference:
    """What the learner's reference forward calls: the policy with its adapter disabled (same weights, no copy).
    `module` lets the log-prob code look at the model as it does through a DeepSpeed engine."""

    def __init__(self, engine: Any, peft_model: Any):
        self.engine, self.module = engine, peft_model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad(), adapter_off(self.module):
            return self.module(*args, **kwargs)


def sync_mode(lora: dict[str, Any] | None) -> str:
    """What a weight update sends: "full" (no LoRA), "adapter" (vLLM serves the base with the adapter), or
    "merged" (the base with the adapter merged in, as a full update) where modules_to_save train whole modules
    beside the adapter: vLLM's LoRA loads extra modules only for embeddings and heads it was started for."""
    if lora is None:
        return "full"
    return "merged" if lora.get("modules_to_save") else "adapter"


def sync_items(peft_model: Any, mode: str, dtype: torch.dtype | None = None, device: str = "cpu"
               ) -> Iterator[tuple[str, torch.Tensor]]:
    """A LoRA learner's weight update: the adapter's tensors (peft's names) or the merged weights."""
    if mode == "merged":
        yield from merged_items(peft_model, dtype, device)
        return
    for name, t in adapter_state(peft_model).items():
        yield name, t.to(device=device, dtype=dtype or t.dtype, copy=True)


def sync_meta(peft_model: Any, mode: str, dtype: torch.dtype | None = None) -> list[tuple[str, torch.dtype, tuple]]:
    """(name, dtype, shape) of sync_items' tensors, in order, without computing any."""
    if mode == "merged":
        base = peft_model.get_base_model()
        out = []
        for name, p in base.named_parameters():
            if ".lora_" in name or ".original_module." in name:
                continue
            n = name.replace(f".modules_to_save.{ADAPTER}.", ".").replace(".base_layer.", ".")
            out.append((n, dtype or p.dtype, tuple(p.shape)))
        return out
    return [(n, dtype or t.dtype, tuple(t.shape)) for n, t in adapter_state(peft_model).items()]


def move_frozen(module: torch.nn.Module, device: str | torch.device) -> int:
    """Colocated on a GPU: the frozen parameters (the base) to `device` and back, in place; the adapter stays
    where DeepSpeed keeps it. Returns the bytes moved. Host copies are pinned, so the way back is a DMA."""
    moved = 0
    target = torch.device(device)
    for p in module.parameters():
        if p.requires_grad or p.device == target:
            continue
        data = p.data.to(target, non_blocking=True)
        if target.type == "cpu" and torch.cuda.is_available():
            data = data.pin_memory()
        p.data = data
        moved += p.numel() * p.element_size()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return moved
