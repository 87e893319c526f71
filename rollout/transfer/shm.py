"""The `shm` weight transfer backend: vLLM's ipc protocol over shared memory, for colocated engines on CPUs.

vLLM's `ipc` engine hands a colocated engine CUDA IPC handles of the trainer's buffers: no copy through
the host, and no NCCL group (NCCL refuses two processes on one GPU). This engine keeps that protocol and
swaps the handle: a named POSIX shared-memory segment (/dev/shm) on the node, which the engine's workers
map and load from. As with ipc, `update_weights` is the transfer (one call per bucket), every trainer rank
packs its own copy into a segment of its own, the sender ships every rank's handle keyed by where it
lives (the host here, the GPU's UUID for ipc), and each worker maps the one on its own host; every rank
waits at a barrier after each bucket so none overwrites a segment a worker still reads.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from multiprocessing import shared_memory

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
from rlscale.rollout.transfer.stats import TransferStats, layerwise_finish, layerwise_start

log = logging.getLogger(__name__)


def host_key() -> str:
    """Where a segment lives: a worker maps only the one written on its own host (pod)."""
    return socket.gethostname()


@dataclass
class ShmInitInfo(WeightTransferInitInfo):
    """No rendezvous: the segments are named in each update."""

    packed: bool = True


@dataclass
class ShmUpdateInfo(WeightTransferUpdateInfo):
    """One bucket: its parameters' names, dtypes and shapes, and {host: segment name}."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    handles: dict[str, str]

    def meta(self) -> list[Meta]:
        return [Meta(n, d, tuple(s)) for n, d, s in zip(self.names, self.dtype_names, self.shapes, strict=True)]


class ShmWeightTransferEngine(WeightTransferEngine[ShmInitInfo, ShmUpdateInfo]):
    """The worker side: maps this host's segment and loads the bucket from a copy of it."""

    init_info_cls = ShmInitInfo
    update_info_cls = ShmUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.stats = TransferStats()

    def init_transfer_engine(self, init_info: ShmInitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        self.stats.begin()
        layerwise_start(self.model)

    def receive_weights(self, update_info: ShmUpdateInfo) -> None:
        here = host_key()
        name = update_info.handles.get(here)
        if name is None:
            raise ValueError(f"shm weight transfer: no segment for host {here!r} (have {sorted(update_info.handles)}); "
                             "the trainer rank colocated with this engine did not send one")
        meta = update_info.meta()
        nbytes = bucket_nbytes(meta, (0, len(meta)))
        seg = shared_memory.SharedMemory(name=name)
        try:
            # A copy, as vLLM's ipc consumer makes: the trainer refills the segment with the next bucket, and the
            # layerwise reload keeps a layer's tensors until the whole layer arrived (some only at finish), so they
            # must not live in the mapping. One bucket is held at a time; the mapping closes at once.
            buf = torch.frombuffer(seg.buf, dtype=torch.uint8, count=nbytes).clone()
        finally:
            seg.close()
        self.stats.hold(nbytes)
        self.stats.received += nbytes
        self.model.load_weights(unpack(buf, meta))
        del buf
        self.stats.release()

    def finish_weight_update(self) -> None:
        layerwise_finish(self.model, self.model_config)
        self.stats.end()

    def shutdown(self) -> None:
        pass
