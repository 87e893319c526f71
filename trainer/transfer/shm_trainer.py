"""The trainer side of the `shm` backend (rlscale.rollout.transfer.shm has the protocol and the workers' side):
every trainer rank packs each bucket into a shared-memory segment of its own; rank 0 ships every rank's handle,
bucket by bucket, and all ranks meet at a barrier before the next (as vLLM's ipc trainer engine does)."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import asdict, dataclass
from multiprocessing import shared_memory
from pathlib import Path
from typing import ClassVar

import torch
from vllm.distributed.weight_transfer.base import TrainerInitInfo, TrainerWeightTransferEngine

from rlscale.rollout.transfer.buckets import (
    DEFAULT_BUCKET_BYTES,
    bucket_nbytes,
    largest_bucket,
    metas,
    pack_into,
    plan_buckets,
    take,
)
from rlscale.rollout.transfer.shm import ShmInitInfo, ShmUpdateInfo, host_key


@dataclass
class ShmTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = "shm"
    bucket_bytes: int = DEFAULT_BUCKET_BYTES


PREFIX = "rlscale-w-"


def clear_stale_segments() -> None:
    """Remove the segments of trainer processes that are gone: a rank that crashed left its segment in /dev/shm,
    which outlives a container restart in its pod (a memory-backed emptyDir). Each name carries its owner's pid;
    another live trainer's (a second run on the machine) is left alone."""
    for path in Path("/dev/shm").glob(PREFIX + "*"):
        pid = path.name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
            clear_stale_segments()
            self.seg = shared_memory.SharedMemory(name=f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}",
                                                  create=True, size=max(1, nbytes))
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
            Path("/dev/shm", self.seg.name.lstrip("/")).unlink(missing_ok=True)
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
