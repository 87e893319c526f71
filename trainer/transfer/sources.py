"""WeightSources: what vLLM's trainer engines send, re-iterated each round: tensors in hand (tests, benches)
or the learner's, declared from its parameters' shapes and streamed by its gathers."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource


class TensorsSource(WeightSource):
    """Named tensors already in hand (a state dict, or (name, tensor) pairs), in the given order."""

    def __init__(self, tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]):
        self.items = list(tensors.items() if isinstance(tensors, Mapping) else tensors)

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self.items]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.items)


class StreamSource(WeightSource):
    """Tensors made on demand: `meta()` lists them without making any, `stream()` makes a fresh pass (a
    learner's gather). `close()` ends an unfinished pass the way its generator ends (a learner's ZeRO-3
    gather still runs to the end so the other ranks finish theirs)."""

    def __init__(self, meta: Callable[[], list[ParamMeta]], stream: Callable[[], Iterator[tuple[str, Any]]]):
        self._meta, self._stream = meta, stream
        self._cached: list[ParamMeta] | None = None
        self._open: Iterator | None = None

    def metadata(self) -> list[ParamMeta]:
        if self._cached is None:
            self._cached = self._meta()
        return self._cached

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        self.close()
        self._open = self._stream()
        return self._open

    def close(self) -> None:
        it, self._open = self._open, None
        close = getattr(it, "close", None)
        if close is not None:
            close()


def param_meta(learner: Any, dtype: str | None = None) -> list:
    """(HF name, dtype, full shape) of every policy parameter in named_parameters() order, without gathering
    (a ZeRO-3 partition keeps its full shape in ds_shape)."""
    from vllm.distributed.weight_transfer.base import ParamMeta

    target = getattr(torch, dtype) if dtype else None
    if getattr(learner, "lora", None) is not None:  # spec.lora: the adapter, or the merged weights
        from rlscale.trainer.lora.policy import sync_meta

        return [ParamMeta(n, d, s) for n, d, s in sync_meta(learner.lora, learner.sync_mode, target)]
    out = []
    for name, p in learner.engine.module.named_parameters():
        shape = tuple(getattr(p, "ds_shape", None) or p.shape)
        out.append(ParamMeta(name, target or p.dtype, shape))
    return out


def learner_source(learner: Any, device: str = "cpu", dtype: str | None = None,
                   all_ranks: bool = False) -> StreamSource:
    """Rank 0's source (the other ranks join its gathers from follow()), or with all_ranks every rank's own
    (each runs the gather loop itself and yields, for backends where every rank sends: ipc, shm)."""
    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        if all_ranks:
            return learner.own_weights(dtype, device)
        if getattr(learner, "lora", None) is not None:
            return learner.sync_weights(dtype, device)
        return learner.iter_weights(dtype, device)

    source = StreamSource(lambda: param_meta(learner, dtype), stream)
    if getattr(learner, "lora", None) is not None and learner.sync_mode == "adapter":
        source.kind = "adapter"  # what the publish log names
    return source


class LearnerRanks:
    """The trainer engine on every learner rank (ipc, shm with several ranks): rank 0 opens, sends and closes,
    and the other ranks do the same from follow(); rank 0 alone holds the replicas' client."""

    def __init__(self, learner: Any, device: str = "cpu"):
        self.learner, self.device = learner, device
        self.world_size = learner.world_size
        self.source = learner_source(learner, device, all_ranks=True)
        self.engine = None

    def open(self, make_info, client) -> None:
        info = make_info(0)
        fields = {k: v for k, v in vars(info).items() if k != "rank"}
        self.learner.transfer_open(type(info).__module__, type(info).__qualname__, fields, self.device, client)
        self.engine = self.learner.transfer_engine

    def send(self) -> None:
        self.learner.transfer_send()

    def close(self) -> None:
        self.learner.transfer_close()
        self.engine = None
