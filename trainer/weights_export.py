"""The policy's weights, one parameter (or one bucket of parameters) at a time.

Under ZeRO-3 each rank holds a shard of every parameter; gathering the whole model at once costs a
full copy per rank (+65 GB per GPU for a 32B model in bfloat16). `gather_weights` gathers a bucket of
at most `bucket_bytes` (a parameter larger than that alone), hands it out and releases it before the
next. The gathers are collective: every rank must run the same loop over the same parameters (ranks
> 0 with emit=False); below ZeRO-3 parameters are whole on every rank and nothing is collective.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

BUCKET_BYTES = 256 * 2**20


def _nbytes(p: torch.Tensor) -> int:
    numel = getattr(p, "ds_numel", None) or p.numel()  # ZeRO-3: the full size, not the shard's
    return int(numel) * p.element_size()


def buckets(params: list[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[list[tuple[str, torch.Tensor]]]:
    """Consecutive parameters in groups of at most bucket_bytes (gathered size); never empty groups."""
    out: list[list[tuple[str, torch.Tensor]]] = []
    size = 0
    for name, p in params:
        n = _nbytes(p)
        if not out or size + n > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append((name, p))
        size += n
    return out


def gather_weights(module, zero3: bool, emit: bool, dtype: torch.dtype | None = None, device="cpu",
                   bucket_bytes: int = BUCKET_BYTES) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, tensor) for every parameter of `module`, in named_parameters() order.

    emit=False (ranks > 0): take part in the gathers and yield nothing. Each tensor is a copy (on
    `device`, in `dtype` when given), so it stays valid after the bucket is released. If the caller stops
    early (close(), or the generator is dropped), the remaining buckets are still gathered, without
    copies, so the other ranks' loops complete.
    """
    import deepspeed

    params = list(module.named_parameters())
    groups = buckets(params, bucket_bytes)
    stopped = False
    for group in groups:
        ctx = (deepspeed.zero.GatheredParameters([p for _, p in group], modifier_rank=None) if zero3
               else contextlib.nullcontext())
        with ctx:
            if not emit or stopped:
                continue
            for name, p in group:
                t = p.detach().to(device=device, dtype=dtype, copy=True)
                try:
                    yield name, t
                except GeneratorExit:
                    stopped = True  # finish the collective loop, then let the generator close
                    break
