"""WeightSources: what vLLM's trainer engines send, re-iterated each round."""

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
