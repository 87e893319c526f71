"""The `gloo` weight transfer backend: vLLM's nccl protocol over gloo, for engines on CPUs.

vLLM's `nccl` engine broadcasts packed buckets from the trainer (rank 0) to every worker of every
engine through one communicator; NCCL needs GPUs. This engine runs the same four phases (init joins a
group the trainer hosts, start begins a layerwise reload, update receives the buckets and loads them,
finish completes the reload) with the bytes on a gloo group instead, so `make test` exercises vLLM's
protocol end to end on CPU with only the wire swapped.

The wire is a chain, not gloo's broadcast: ranks 0 -> 1 -> ... -> n, each bucket in chunks, every rank
forwarding chunk c to the next while it receives chunk c+1. The trainer then sends each byte once
whatever the number of receivers, as NCCL's ring does (gloo's broadcast has the root send to every rank).
A receiver holds one bucket at a time (rollout.transfer.buckets says why that bound holds).
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from rlscale.rollout.transfer.buckets import (
    Meta,
    bucket_nbytes,
    unpack,
)
from rlscale.rollout.transfer.stats import TransferStats, layerwise_finish, layerwise_start, worker_rank

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 * 2**20


def _td(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def open_group(store, rank: int, size: int, timeout_s: float):
    """A gloo group on `store` alone: no default group is created or touched."""
    return torch.distributed.ProcessGroupGloo(torch.distributed.PrefixStore("pg", store), rank, size, _td(timeout_s))


class Chain:
    """Moves one flat uint8 tensor from rank 0 along the chain 0 -> 1 -> ... -> size-1."""

    def __init__(self, pg, rank: int, size: int, chunk_bytes: int = CHUNK_BYTES, timeout_s: float = 120.0):
        self.pg, self.rank, self.size = pg, rank, size
        self.chunk_bytes, self.timeout = max(1, int(chunk_bytes)), _td(timeout_s)
        self.bytes_sent = 0

    def _chunks(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [flat[i:i + self.chunk_bytes] for i in range(0, flat.numel(), self.chunk_bytes)]

    def send(self, flat: torch.Tensor) -> None:
        """Rank 0: every byte goes out once, to rank 1."""
        works = [self.pg.send([c], 1, 0) for c in self._chunks(flat)]
        for w in works:
            w.wait(self.timeout)
        self.bytes_sent += flat.numel()

    def recv(self, flat: torch.Tensor) -> None:
        """Ranks 1..n: fill `flat`, forwarding each chunk to the next rank as soon as it arrives."""
        pending = []
        for c in self._chunks(flat):
            self.pg.recv([c], self.rank - 1, 0).wait(self.timeout)
            if self.rank + 1 < self.size:
                pending.append(self.pg.send([c], self.rank + 1, 0))
                self.bytes_sent += c.numel()
        for w in pending:
            w.wait(self.timeout)


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    """Worker side: where the trainer's store listens, this worker's first rank and the group's size."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    chunk_bytes: int = CHUNK_BYTES
    timeout_s: float = 120.0


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """One update: every parameter's name, dtype and shape, and the buckets ([start, end) of them)."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    buckets: list[list[int]]

    def meta(self) -> list[Meta]:
        return [Meta(n, d, tuple(s)) for n, d, s in zip(self.names, self.dtype_names, self.shapes, strict=True)]


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """The worker side: receives each bucket along the chain and loads it through vLLM's layerwise reload."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.chain: Chain | None = None
        self.store = None
        self.stats = TransferStats()

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        rank = init_info.rank_offset + worker_rank(self.parallel_config)
        self.store = torch.distributed.TCPStore(init_info.master_address, int(init_info.master_port), None, False,
                                                _td(init_info.timeout_s))
        pg = open_group(self.store, rank, init_info.world_size, init_info.timeout_s)
        self.chain = Chain(pg, rank, init_info.world_size, init_info.chunk_bytes, init_info.timeout_s)

    def start_weight_update(self) -> None:
        self.stats.begin()
        layerwise_start(self.model)

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.chain is None:
            raise RuntimeError("gloo weight transfer: update before init_transfer_engine")
        meta = update_info.meta()
        sent0 = self.chain.bytes_sent
        for a, b in update_info.buckets:
            part = meta[a:b]
            buf = torch.empty(bucket_nbytes(meta, (a, b)), dtype=torch.uint8, device=self.device)
            self.stats.hold(buf.numel())
            self.chain.recv(buf)
            self.stats.received += buf.numel()
            self.model.load_weights(unpack(buf, part))
            del buf
            self.stats.release()
        self.stats.forwarded += self.chain.bytes_sent - sent0

    def finish_weight_update(self) -> None:
        layerwise_finish(self.model, self.model_config)
        self.stats.end()

    def shutdown(self) -> None:
        self.chain = self.store = None
