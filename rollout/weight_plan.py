"""In-place weight updates for a live vLLM model by plain copies, planned once per engine.

vLLM's reload (`reload_weights`) re-runs the whole loading machinery on every update: it
moves each layer to the meta device, rebuilds it, buffers every tensor through wrapped
weight loaders, re-runs `process_weights_after_loading` and copies the result back. A
plan does the same work directly: each checkpoint (HF) name maps, once, to the vLLM
parameter and the rows of it that the stacked loaders (q/k/v into qkv_proj, gate/up into
gate_up_proj) would write; an update is then one copy per tensor.

On CPU the linear layers compute from a packed copy of their weight that the kernel
owns (a oneDNN handle, or sgl's packed tensor); vLLM drops the plain weight after packing.
A packed layer is therefore staged whole (its shards copied into one checkpoint-layout
tensor, or the caller's tensor used as is when it is the whole weight) and packed again
by vLLM's own `process_weights_after_loading`, so the kernel is the one a fresh engine
picks. Tied LM heads are packed again when the embedding changes. On GPU nothing is
packed: an update is the copies alone.

Anything the plan cannot place exactly (quantised layers, LoRA, tensor parallelism,
renaming rules beyond stacking, unknown names, a packed layer given only some of its
shards, a shape that does not fit) is refused before anything is written, and the
caller falls back to vLLM's reload.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes: rows [offset, offset + size) of `module.<param>`."""

    module: Any
    param: str
    offset: int
    size: int
    rows: int  # rows of the whole (checkpoint-layout) parameter
    shape: tuple[int, ...]  # the tensor's expected shape
    packed: bool  # CPU: the weight lives only in the kernel's packed form (staged, then packed)


SKIP = "skip"  # a name the stock loader ignores (a tied lm_head)


class WeightPlan:
    """Checkpoint name -> Target for one vLLM model; `apply` updates it or says why not."""

    def __init__(self, model, vllm_config):
        from vllm.platforms import current_platform

        self.model = model
        self.vllm_config = vllm_config
        self.cpu = current_platform.is_cpu()
        # Whether a packed layer may be packed straight from the caller's tensor: the oneDNN
        # and sgl packers copy it (the test zeroes the caller's tensors after an update);
        # zentorch without prepacking keeps a view of it, so it gets a staged copy.
        self.borrow = self.cpu and not getattr(current_platform, "is_zen_cpu", lambda: False)()
        self.targets: dict[str, Target | str] = {}  # str: SKIP or why the name cannot be planned
        self.refusal = self._engine_refusal(current_platform)
        # CPU: id(parameter) -> the modules that must be packed again when it changes
        # (a tied LM head shares the embedding's parameter).
        self.repack_owners: dict[int, list[Any]] = {}
        if self.cpu and self.refusal is None:
            for module in model.modules():
                w = module._parameters.get("weight")
                if w is not None and _needs_repack(module):
                    self.repack_owners.setdefault(id(w), []).append(module)

    def _engine_refusal(self, platform) -> str | None:
        cfg = self.vllm_config
        if cfg.model_config.quantization is not None:
            return f"quantised model ({cfg.model_config.quantization})"
        if cfg.lora_config is not None:
            return "LoRA enabled"
        par = cfg.parallel_config
        if par.tensor_parallel_size != 1 or par.pipeline_parallel_size != 1:
            return "tensor or pipeline parallelism"
        if not (platform.is_cpu() or platform.is_cuda_alike()):
            return f"platform {platform.device_type}"
        mapper = getattr(self.model, "hf_to_vllm_mapper", None)
        if mapper is not None and (
            mapper.orig_to_new_renaming or mapper.orig_to_new_regex or mapper.orig_to_new_prefix
        ):
            return "the model renames checkpoint weights beyond stacking"
        return None

    def target(self, name: str) -> Target | str:
        t = self.targets.get(name)
        if t is None:
            t = self.targets[name] = self._resolve(name)
        return t

    def _resolve(self, name: str) -> Target | str:
        from vllm.model_executor.layers.linear import (
            MergedColumnParallelLinear,
            QKVParallelLinear,
            UnquantizedLinearMethod,
        )
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        hf_config = self.vllm_config.model_config.hf_config
        if getattr(hf_config.get_text_config(), "tie_word_embeddings", False) and name.startswith("lm_head."):
            return SKIP  # the stock loader skips it too: the head is the embedding
        shard = None
        vname = name
        mapper = getattr(self.model, "hf_to_vllm_mapper", None)
        if mapper is not None:
            mapped = mapper._map_name_with_shard(name)
            if mapped is None:
                return f"{name}: the model's mapper drops it"
            vname, shard = mapped
        path, _, pname = vname.rpartition(".")
        try:
            module = self.model.get_submodule(path)
        except AttributeError:
            return f"{name}: no module {path!r}"
        param = module._parameters.get(pname)
        if param is None:
            return f"{name}: {path!r} has no parameter {pname!r}"
        qm = getattr(module, "quant_method", None)
        if qm is not None and not _unquantized(qm):
            return f"{name}: {type(qm).__name__} layer"
        if qm is None and hasattr(module, "process_weights_after_loading"):
            return f"{name}: {type(module).__name__} processes its weights after loading"
        packed = (
            self.cpu and pname == "weight" and param.numel() == 0
            and isinstance(qm, UnquantizedLinearMethod)
        )
        if packed:
            full = (sum(module.output_partition_sizes), module.input_size_per_partition)
        else:
            full = tuple(param.shape)
        if not full:
            return f"{name}: scalar parameter"
        rows = full[0]
        if isinstance(module, VocabParallelEmbedding) and pname == "weight":
            # The loader fills the first org_vocab_size rows; the padding rows stay zero.
            si = module.shard_indices
            if shard is not None or si.org_vocab_start_index != 0 or getattr(param, "packed_dim", None) is not None:
                return f"{name}: sharded or packed vocabulary"
            offset, size = 0, si.org_vocab_end_index
        elif shard is None:
            offset, size = 0, rows
        elif type(module) is QKVParallelLinear and shard in ("q", "k", "v"):
            offset, size = module._get_shard_offset_mapping(shard), module._get_shard_size_mapping(shard)
        elif type(module) is MergedColumnParallelLinear and isinstance(shard, int):
            sizes = list(module.output_partition_sizes)
            if not 0 <= shard < len(sizes):
                return f"{name}: shard {shard} of {len(sizes)}"
            offset, size = sum(sizes[:shard]), sizes[shard]
        else:
            return f"{name}: shard {shard!r} of a {type(module).__name__}"
        if offset is None or size is None or offset + size > rows:
            return f"{name}: shard {shard!r} outside {rows} rows"
        return Target(module, pname, offset, size, rows, (size, *full[1:]), packed)

    def apply(self, weights: list[tuple[str, torch.Tensor]]) -> dict[str, Any] | str:
        """Copy `weights` in place and pack again what must be; the timings, or why not
        (then nothing was written)."""
        import torch

        if self.refusal is not None:
            return self.refusal
        t0 = time.perf_counter()
        plan: list[tuple[Target, torch.Tensor]] = []
        shards: dict[int, list[tuple[Target, torch.Tensor]]] = {}  # packed module -> its shards
        for name, tensor in weights:
            t = self.target(name)
            if t is SKIP:
                continue
            if isinstance(t, str):
                return t
            if tuple(tensor.shape) != t.shape:
                return f"{name}: shape {tuple(tensor.shape)}, the engine holds {t.shape}"
            if t.packed:
                shards.setdefault(id(t.module), []).append((t, tensor))
            else:
                plan.append((t, tensor))
        for parts in shards.values():
            spans = sorted((t.offset, t.size) for t, _ in parts)
            end = 0
            for off, size in spans:
                if off != end:
                    break
                end += size
            if end != parts[0][0].rows or len(spans) != len({s for s, _ in spans}):
                t = parts[0][0]
                return f"{type(t.module).__name__}: shards {spans} do not cover its {t.rows} rows exactly once"
        t1 = time.perf_counter()
        repack: dict[int, Any] = {}
        staged: dict[int, torch.Tensor] = {}
        borrowed: set[int] = set()  # staged modules given the caller's own tensor
        with torch.no_grad():
            for t, tensor in plan:
                p = getattr(t.module, t.param)
                dst = p.data if t.size == t.rows else p.data.narrow(0, t.offset, t.size)
                dst.copy_(tensor)
                for owner in self.repack_owners.get(id(p), ()):
                    repack[id(owner)] = owner
            for parts in shards.values():
                t, tensor = parts[0]
                w = getattr(t.module, t.param)
                if (self.borrow and len(parts) == 1 and tensor.dtype == w.dtype
                        and tensor.device == w.device and tensor.is_contiguous()):
                    full = tensor  # the packer reads it once and keeps its own copy
                    borrowed.add(id(t.module))
                else:
                    full = torch.empty((t.rows, *t.shape[1:]), dtype=w.dtype, device=w.device)
                    for t, tensor in parts:
                        full.narrow(0, t.offset, t.size).copy_(tensor)
                staged[id(t.module)] = full
                repack[id(t.module)] = t.module
            t2 = time.perf_counter()
            for key, module in repack.items():
                _repack(module, staged.get(key), borrowed=key in borrowed)
        t3 = time.perf_counter()
        return {
            "path": "plan", "tensors": len(plan) + sum(len(p) for p in shards.values()),
            "repacked": len(repack), "check_s": t1 - t0, "copy_s": t2 - t1, "repack_s": t3 - t2,
        }


def _unquantized(qm) -> bool:
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    return type(qm) in (UnquantizedLinearMethod, UnquantizedEmbeddingMethod)


def _needs_repack(module) -> bool:
    """CPU: modules whose kernel computes from a packed copy of `weight`.

    Linear layers and LM heads. A plain VocabParallelEmbedding gets a packed copy at load
    too, but its forward is a lookup in `weight` itself and nothing reads that copy."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        UnquantizedEmbeddingMethod,
    )

    qm = getattr(module, "quant_method", None)
    return type(qm) is UnquantizedLinearMethod or (
        isinstance(module, ParallelLMHead) and type(qm) is UnquantizedEmbeddingMethod
    )


def _repack(module, staged, borrowed: bool) -> None:
    """Pack `module.weight` again with vLLM's own processing (the kernel a fresh engine
    picks). `staged`: the whole weight, for a layer whose plain weight was dropped."""
    w = module._parameters["weight"]
    if staged is not None:
        w.data = staged
    module.quant_method.process_weights_after_loading(module)
    new = module._parameters["weight"]
    if new is not w:
        # vLLM swapped in an empty placeholder; keep the original Parameter object.
        w.data = new.data
        module._parameters["weight"] = w
    if borrowed and w.numel() and w.data_ptr() == staged.data_ptr():
        # The kernel kept the plain weight (a fallback GEMM): never alias the caller's tensor.
        w.data = staged.clone()
