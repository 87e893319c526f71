"""Exporting a LoRA run (spec.lora): its checkpoints hold the adapter alone (and the base's identity), so the
export rebuilds the peft model on the base the run trained and writes the merged model (`--hf`) and/or the
peft adapter directory (`--adapter`, loadable with peft's PeftModel.from_pretrained on that base)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlscale.trainer import checkpoint


class AdapterMismatch(RuntimeError):
    """The checkpoint's adapter does not fit the model directory given (export_hf says it as an ExportError)."""


def lora_state(step_dir: Path) -> dict[str, Any] | None:
    """The checkpoint's LoRA state (base identity, adapter config), None for a full-model checkpoint."""
    return (checkpoint.read_state(Path(step_dir)).get("learner") or {}).get("lora")


def peft_model_from(sd: dict[str, Any], lora: dict[str, Any], model_dir: Path, dtype: str, source: str) -> Any:
    """The run's policy: the base from `model_dir` wrapped with the checkpoint's adapter config, the adapter's
    trained tensors (`sd`: the checkpoint's, under the PeftModel's parameter names) loaded into it."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlscale.trainer.lora.identity import base_identity
    from rlscale.trainer.lora.policy import wrap

    saved = (lora.get("base") or {}).get("sha256")
    if saved and saved != base_identity(model_dir)["sha256"]:
        raise AdapterMismatch(f"--model: {model_dir} is not the base {source} trained its adapter on "
                          f"({lora['base'].get('path')!r}); pass that model directory")
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype), local_files_only=True)
    model = wrap(base, {**lora["config"], "lora_dropout": 0.0})
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    missing, unexpected = model.load_state_dict({k: v.to(getattr(torch, dtype)) for k, v in sd.items()},
                                                strict=False)
    lost = sorted(trainable & set(missing))
    if lost or unexpected:
        raise AdapterMismatch(f"{source}: its adapter does not match spec.lora on {model_dir} (missing {lost[:4]}, "
                          f"unexpected {list(unexpected)[:4]}); pass the model directory the run trained")
    return model.eval()


def save_adapter(model: Any, model_dir: Path, out: Path, files: tuple[str, ...]) -> Path:
    """peft's adapter directory (adapter_config.json naming the base, adapter_model.safetensors) and the base's
    `files` (its tokenizer's)."""
    import shutil

    from rlscale.trainer.lora.policy import ADAPTER

    model.peft_config[ADAPTER].base_model_name_or_path = str(model_dir)
    model.save_pretrained(out, safe_serialization=True)
    for name in files:
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, out / name)
    return out
