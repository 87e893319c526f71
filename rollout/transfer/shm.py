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
import time
import uuid
from dataclasses import asdict, dataclass
from multiprocessing import shared_memory
from typing import ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from rlscale.rollout.transfer.buckets import (
    DEFAULT_BUCKET_BYTES,
    Meta,
    bucket_nbytes,
    largest_bucket,
    metas,
    pack_into,
    plan_buckets,
    take,
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
    """The worker side: maps this host's segment, loads the bucket from it in place (no receive buffer)."""

    init_info_cls = ShmInitInfo
    update_info_cls = ShmUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.stats = TransferStats()
        self._held: list[shared_memory.SharedMemory] = []

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
        seg = shared_memory.SharedMemory(name=name)
        nbytes = bucket_nbytes(meta, (0, len(meta)))
        buf = torch.frombuffer(seg.buf, dtype=torch.uint8, count=nbytes)
        self.stats.received += nbytes
        self.model.load_weights(unpack(buf, meta))
        del buf
        try:
            seg.close()
        except BufferError:  # a layer still holds views (it was not complete): close it at finish
            self._held.append(seg)

    def finish_weight_update(self) -> None:
        layerwise_finish(self.model, self.model_config)
        for seg in self._held:
            seg.close()
        self._held = []
        self.stats.end()

    def shutdown(self) -> None:
        pass


@dataclass
class ShmTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = "shm"
    bucket_bytes: int = DEFAULT_BUCKET_BYTES


class ShmTrainerWeightTransferEngine(TrainerWeightTransferEngine[ShmTrainerInitInfo]):
    """Every trainer rank: packs each bucket into its segment; rank 0 ships all ranks' handles, bucket by bucket.
    Multi-rank trainers gather the handles and meet at barriers on the default process group, as vLLM's
    ipc trainer engine does."""

    init_info_cls = ShmTrainerInitInfo

    def __init__(self, *, client, source, info: ShmTrainerInitInfo) -> None:
        super().__init__(client=client, source=source, is_sender=info.is_sender)
        self.info = info
        self.seg: shared_memory.SharedMemory | None = None
        self.last_seconds, self.last_bytes = 0.0, 0

    @classmethod
    def trainer_init(cls, init_info: ShmTrainerInitInfo, *, client, source=None):
        if source is None:
            raise ValueError("shm trainer weight transfer needs a WeightSource")
        engine = cls(client=client, source=source, info=init_info)
        if engine.is_sender:
            client.init_weight_transfer_engine(asdict(ShmInitInfo()))
        return engine

    def _segment(self, nbytes: int) -> shared_memory.SharedMemory:
        if self.seg is None or self.seg.size < nbytes:
            self._free()
            self.seg = shared_memory.SharedMemory(name=f"rlscale-w-{uuid.uuid4().hex[:16]}", create=True,
                                                  size=max(1, nbytes))
        return self.seg

    def send_weights(self) -> None:
        t0 = time.perf_counter()
        meta = metas(self.source.metadata())
        buckets = plan_buckets(meta, self.info.bucket_bytes)
        seg = self._segment(largest_bucket(meta, buckets))
        items = iter(self.source)
        if self.is_sender:
            self.client.start_weight_update()
        sent = 0
        for a, b in buckets:
            buf = torch.frombuffer(seg.buf, dtype=torch.uint8, count=bucket_nbytes(meta, (a, b)))
            pack_into(buf, take(items, meta[a:b]), meta[a:b])
            del buf
            handles = _gather({host_key(): seg.name})
            if self.is_sender:
                part = meta[a:b]
                self.client.update_weights(asdict(ShmUpdateInfo(
                    names=[m.name for m in part], dtype_names=[m.dtype for m in part],
                    shapes=[list(m.shape) for m in part], handles=handles)))
            sent += bucket_nbytes(meta, (a, b))
            _barrier()  # no rank refills its segment while a worker reads it
        if next(items, None) is not None:
            raise ValueError("weight source yielded more parameters than its metadata declared")
        if self.is_sender:
            self.client.finish_weight_update()
        self.last_seconds, self.last_bytes = time.perf_counter() - t0, sent

    def _free(self) -> None:
        if self.seg is not None:
            self.seg.close()
            self.seg.unlink()
            self.seg = None

    def shutdown(self) -> None:
        self._free()


def _distributed() -> bool:
    return torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1


def _gather(handle: dict[str, str]) -> dict[str, str]:
    """Every rank's {host: segment}, merged (ranks on one host share it: their copies are the same)."""
    if not _distributed():
        return dict(handle)
    out: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, handle)
    merged: dict[str, str] = {}
    for h in out:
        merged.update(h or {})
    return merged


def _barrier() -> None:
    if _distributed():
        torch.distributed.barrier()
