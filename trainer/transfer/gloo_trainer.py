"""The trainer side of the `gloo` backend (rlscale.rollout.transfer.gloo has the protocol and the workers'
side): rank 0 of the chain hosts the store, forms the group with every worker of every replica, and streams
each update bucket by bucket while the workers receive it."""

from __future__ import annotations

import datetime
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import ClassVar

import torch
from vllm.distributed.weight_transfer.base import TrainerInitInfo, TrainerWeightTransferEngine

from rlscale.rollout.transfer.buckets import DEFAULT_BUCKET_BYTES, bucket_nbytes, metas, pack_into, plan_buckets, take
from rlscale.rollout.transfer.gloo import CHUNK_BYTES, Chain, GlooInitInfo, GlooUpdateInfo, open_group


def _td(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """Trainer side: the address the trainer's store listens on (port 0: a free one), the group's size
    (1 + every worker of every engine), the bucket and chunk sizes and the timeout of any one wait."""

    backend: ClassVar[str] = "gloo"
    master_address: str = "127.0.0.1"
    master_port: int = 0
    world_size: int = 2
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    chunk_bytes: int = CHUNK_BYTES
    timeout_s: float = 120.0


@dataclass
class _Sent:
    seconds: float = 0.0
    bytes: int = 0
    buckets: list[int] = field(default_factory=list)


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Rank 0 of the chain: hosts the store, forms the group with the workers, streams each update."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client, source, info: GlooTrainerInitInfo) -> None:
        super().__init__(client=client, source=source, is_sender=info.is_sender)
        self.info = info
        self.chain: Chain | None = None
        self.store = None
        self.last = _Sent()

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client, source=None):
        if source is None:
            raise ValueError("gloo trainer weight transfer needs a WeightSource")
        engine = cls(client=client, source=source, info=init_info)
        if not engine.is_sender:
            return engine
        i = init_info
        engine.store = torch.distributed.TCPStore(i.master_address, int(i.master_port), None, True, _td(i.timeout_s),
                                                  wait_for_workers=False)
        worker = GlooInitInfo(master_address=i.master_address, master_port=engine.store.port, rank_offset=1,
                              world_size=i.world_size, chunk_bytes=i.chunk_bytes, timeout_s=i.timeout_s)
        # The workers block in their group's rendezvous until rank 0 joins it too: both at once.
        with ThreadPoolExecutor(1) as pool:
            joined = pool.submit(client.init_weight_transfer_engine, asdict(worker))
            pg = open_group(engine.store, 0, i.world_size, i.timeout_s)
            joined.result()
        engine.chain = Chain(pg, 0, i.world_size, i.chunk_bytes, i.timeout_s)
        return engine

    def send_weights(self) -> None:
        source, t0 = self.source, time.perf_counter()
        meta = metas(source.metadata())
        buckets = plan_buckets(meta, self.info.bucket_bytes)
        items = iter(source)
        if not self.is_sender:
            for _ in items:
                pass
            return
        update = GlooUpdateInfo(names=[m.name for m in meta], dtype_names=[m.dtype for m in meta],
                                shapes=[list(m.shape) for m in meta], buckets=[list(b) for b in buckets])
        self.client.start_weight_update()
        sent0 = self.chain.bytes_sent
        pool = ThreadPoolExecutor(1, thread_name_prefix="rlscale-gloo-update")
        try:
            # The workers receive inside update_weights while this thread sends: both at once.
            receiving = pool.submit(self.client.update_weights, asdict(update))
            sizes = []
            for a, b in buckets:
                if receiving.done():
                    receiving.result()  # a worker refused the update before any byte: say why now
                tensors = take(items, meta[a:b])
                buf = torch.empty(bucket_nbytes(meta, (a, b)), dtype=torch.uint8)
                pack_into(buf, tensors, meta[a:b])
                del tensors
                self.chain.send(buf)
                sizes.append(buf.numel())
            if next(items, None) is not None:
                raise ValueError("weight source yielded more parameters than its metadata declared")
            receiving.result()
        finally:
            pool.shutdown(wait=False)  # after a broken send a worker may never return: never wait for it
        self.client.finish_weight_update()
        self.last = _Sent(time.perf_counter() - t0, self.chain.bytes_sent - sent0, sizes)

    def shutdown(self) -> None:
        self.chain = self.store = None

