"""Buckets of a weight update: parameters packed into flat byte buffers, cut at layer boundaries.

vLLM's layerwise reload (what every weight transfer engine loads through) keeps the tensors of a
layer until the whole layer has arrived, then processes it. A bucket that ended inside a layer would
leave that layer's first part alive after its buffer is done, so a receiver held two buckets at once;
cut at the groups of vLLM's `layerwise_groups` (one per decoder layer, plus the embeddings before and
the final norm and head after), a receiver holds one bucket and the layers in it are processed before
the next arrives. A group larger than the bucket travels alone, in a bucket of its own size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlscale.plan.placement import TRANSFER_BUCKET_BYTES as DEFAULT_BUCKET_BYTES

# Each tensor starts at a multiple of this in its bucket: a view of the bytes as a wider dtype needs its offset
# divisible by the element size (a bool mask of 5 bytes would leave the next float32 at an odd offset).
ALIGN = 16


@dataclass(frozen=True)
class Meta:
    """One parameter as the wire carries it: HF name, dtype name (no 'torch.'), full shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtype_of(self.dtype).itemsize


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a weight update")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def metas(params: Iterable[Any]) -> list[Meta]:
    """Meta of each vLLM ParamMeta (or anything with name, dtype, shape)."""
    return [Meta(p.name, dtype_name(p.dtype) if isinstance(p.dtype, torch.dtype) else str(p.dtype),
                 tuple(int(s) for s in p.shape)) for p in params]


def _groups(names: list[str]) -> list[list[str]]:
    from vllm.distributed.weight_transfer.base import layerwise_groups

    return layerwise_groups(names)


def plan_buckets(meta: Sequence[Meta], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[tuple[int, int]]:
    """[start, end) ranges of `meta` (in its order), each at most bucket_bytes unless one layer group is
    larger, and never ending inside a group. The sender's order must be the groups' order: parameters of
    one layer together, as a model's named_parameters() gives them; a source that interleaves layers is
    refused (its buckets could not keep the bound)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes: {bucket_bytes}; use a positive size")
    names = [m.name for m in meta]
    index = {n: i for i, n in enumerate(names)}
    spans: list[tuple[int, int, int]] = []  # (start, end, bytes) per group, in the source's order
    for group in _groups(names):
        idx = sorted(index[n] for n in group)
        if idx[-1] - idx[0] + 1 != len(idx):
            raise ValueError(f"weight source order: the parameters of the layer of {names[idx[0]]!r} are not "
                             "together; yield each layer's parameters in a row (named_parameters() order)")
        spans.append((idx[0], idx[-1] + 1, sum(meta[i].nbytes for i in idx)))
    spans.sort()
    buckets: list[tuple[int, int]] = []
    start, size = 0, 0
    for a, _end, nbytes in spans:
        if size and size + nbytes > bucket_bytes:
            buckets.append((start, a))
            start, size = a, 0
        size += nbytes
    if meta:
        buckets.append((start, len(meta)))
    return buckets


def offsets(meta: Sequence[Meta]) -> tuple[list[int], int]:
    """Where each tensor starts in a bucket holding `meta`, and the bucket's size (ALIGN-ed starts)."""
    out, pos = [], 0
    for m in meta:
        out.append(pos)
        pos += -(-m.nbytes // ALIGN) * ALIGN
    return out, pos


def bucket_nbytes(meta: Sequence[Meta], bucket: tuple[int, int]) -> int:
    return offsets(meta[bucket[0]:bucket[1]])[1]


def largest_bucket(meta: Sequence[Meta], buckets: Sequence[tuple[int, int]]) -> int:
    return max((bucket_nbytes(meta, b) for b in buckets), default=0)


def pack_into(buf: torch.Tensor, tensors: Sequence[torch.Tensor], meta: Sequence[Meta]) -> int:
    """Copy each tensor's bytes into `buf` (flat uint8) at its offset; returns the bucket's size."""
    starts, size = offsets(meta)
    for t, pos in zip(tensors, starts, strict=True):
        flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
        buf[pos:pos + flat.numel()].copy_(flat)
    return size


def unpack(buf: torch.Tensor, meta: Sequence[Meta]) -> list[tuple[str, torch.Tensor]]:
    """Views of `buf` as the tensors `meta` describes (no copy: they live as long as the buffer)."""
    starts, _ = offsets(meta)
    return [(m.name, buf[pos:pos + m.nbytes].view(dtype_of(m.dtype)).view(m.shape))
            for m, pos in zip(meta, starts, strict=True)]


def take(items: Iterator[tuple[str, torch.Tensor]], meta: Sequence[Meta]) -> list[torch.Tensor]:
    """The next len(meta) tensors of the source, checked against what the receivers were told."""
    out = []
    for m in meta:
        try:
            name, t = next(items)
        except StopIteration:
            raise ValueError(f"weight source ended before {m.name!r}; its metadata declared more") from None
        if name != m.name or dtype_name(t.dtype) != m.dtype or tuple(t.shape) != m.shape:
            raise ValueError(f"weight source yielded {name!r} {dtype_name(t.dtype)} {tuple(t.shape)} where its "
                             f"metadata declared {m.name!r} {m.dtype} {m.shape}")
        out.append(t)
    return out
