"""The engines' side of LoRA sync (spec.lora): each weight update is an adapter, served by vLLM's LoRA support.

vLLM 0.32 loads a LoRA adapter from a peft directory only (`LoRARequest(name, id, path)`, then
`add_lora`/`remove_lora`; its CPU build serves them with its punica CPU kernels). The adapter's tensors
travel as any update does, on the run's transfer backend (rlscale.rollout.transfer, or vLLM's nccl/ipc):
for the update the transfer engine's target is an `AdapterSink` (vLLM's `set_weight_update_target`) that keeps
what arrives instead of loading it into the model; at the end the worker writes them as a peft directory
on its own host, and the engine swaps adapters: one id per weights version, the old one removed
(max_loras 1). The base model's weights never move.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

ADAPTER_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"


class AdapterSink(torch.nn.Module):
    """Stands in for the model during an adapter update: keeps each received tensor (a copy: the transfer
    engine's receive buffer is reused). vLLM's layerwise reload runs over it as over an empty model."""

    def __init__(self) -> None:
        super().__init__()
        self.tensors: dict[str, torch.Tensor] = {}

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        names = set()
        for name, t in weights:
            self.tensors[name] = t.detach().to("cpu", copy=True)
            names.add(name)
        return names

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def adapter_config(tensors: dict[str, torch.Tensor], alpha: float | None) -> dict[str, Any]:
    """peft's adapter_config.json for these tensors: the rank from lora_A's shape, the modules from the names
    (peft saves base_model.model.<module path>.lora_A.weight)."""
    ranks = {int(t.shape[0]) for n, t in tensors.items() if ".lora_A." in n}
    if len(ranks) != 1:
        raise ValueError(f"LoRA update: expected one rank across lora_A tensors, got {sorted(ranks) or 'none'} "
                         f"in {len(tensors)} tensors")
    rank = ranks.pop()
    modules = sorted({n.split(".lora_")[0].rsplit(".", 1)[-1] for n in tensors if ".lora_" in n})
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha or rank,
            "lora_dropout": 0.0, "target_modules": modules, "bias": "none", "modules_to_save": None,
            "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "inference_mode": True}


def write_adapter(tensors: dict[str, torch.Tensor], directory: str | Path, alpha: float | None) -> Path:
    """The tensors as a peft adapter directory (replaced whole if it exists)."""
    from safetensors.torch import save_file

    d = Path(directory)
    tmp = d.with_name(d.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(tmp / ADAPTER_FILE))
    (tmp / CONFIG_FILE).write_text(json.dumps(adapter_config(tensors, alpha), indent=1))
    shutil.rmtree(d, ignore_errors=True)
    tmp.rename(d)
    return d


class AdapterSlot:
    """The engine's one served adapter: each version gets its own id (version + 1; vLLM's ids start at 1) and
    directory, the previous one is removed first (the engine takes no requests during an update)."""

    def __init__(self, root: str | Path, alpha: float | None):
        self.root, self.alpha = Path(root), alpha
        self.request = None  # the LoRARequest generate() passes; None: the base model (version 0)
        self.bytes = 0  # the last adapter's size

    def swap(self, llm: Any, version: int, directory: Path) -> Any:
        from vllm.lora.request import LoRARequest

        old = self.request
        if old is not None:
            llm.llm_engine.remove_lora(old.lora_int_id)
        req = LoRARequest(f"rlscale-v{version}", version + 1, str(directory), load_inplace=True)
        if not llm.llm_engine.add_lora(req):
            raise RuntimeError(f"LoRA update: vLLM did not load the adapter of version {version} from {directory}")
        self.request = req
        if old is not None and Path(old.lora_path) != Path(directory):
            shutil.rmtree(old.lora_path, ignore_errors=True)
        return req

    def directory(self, version: int) -> Path:
        return self.root / f"v{version}"
