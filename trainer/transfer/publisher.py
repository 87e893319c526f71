"""Publishing a weights version to every ready replica through one of vLLM's trainer engines.

The group's members are the replicas whose engine is up when a publish starts. A change of that set (a
replica joined, restarted or left) closes the group and forms a new one before the send; a send that
breaks (a replica died mid-update) aborts the update on the survivors and is tried once more with the
replicas then ready. A replica that joins between publishes takes the next one: it holds the model
directory's weights until then, and requests that need a newer version wait for it (rollout.serve).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlscale.rollout.transfer import ALL_RANK_BACKENDS, register
from rlscale.rollout.transfer.buckets import DEFAULT_BUCKET_BYTES, metas
from rlscale.rollout.transfer.control import Member, ReplicaClient, WeightTransferError

log = logging.getLogger(__name__)


@dataclass
class SyncResult:
    """What one publish did: the driver logs `describe()`; the bench reads the figures."""

    version: int
    backend: str
    replicas: int = 0
    seconds: float = 0.0
    tensor_bytes: int = 0  # the weights' size
    bytes_sent: int = 0  # out of the sending trainer process (gloo: into the chain; 0 where vLLM's engines send)
    formed: bool = False  # the group was formed (again) for this publish
    retried: str = ""  # why the first send failed, when a second one went through
    receivers: dict[str, Any] = field(default_factory=dict)  # replica -> its figures of the update
    kind: str = "weights"  # "adapter" when a LoRA learner's source sends its adapter (spec.lora)

    def describe(self) -> str:
        if not self.replicas:
            return f"weights v{self.version}: no replica ready ({self.retried or 'none registered'})"
        plural = "s" if self.replicas != 1 else ""
        s = (f"{self.kind} v{self.version} by {self.backend} to {self.replicas} replica{plural} "
             f"in {self.seconds:.2f} s ({self.tensor_bytes / 2**20:.1f} MiB)")
        if self.formed:
            s += ", group formed"
        return s + (f"; retried after: {self.retried}" if self.retried else "")


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def trainer_init_info(backend: str, rank: int, *, host: str, world_size: int, bucket_bytes: int,
                      timeout_s: float) -> Any:
    """The trainer-side init info of `backend` for trainer rank `rank` (the sender is rank 0)."""
    register()
    if backend == "gloo":
        from rlscale.trainer.transfer.gloo_trainer import GlooTrainerInitInfo

        return GlooTrainerInitInfo(rank=rank, master_address=host, world_size=world_size, bucket_bytes=bucket_bytes,
                                   timeout_s=timeout_s)
    if backend == "shm":
        from rlscale.trainer.transfer.shm_trainer import ShmTrainerInitInfo

        return ShmTrainerInitInfo(rank=rank, bucket_bytes=bucket_bytes)
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        return NCCLTrainerInitInfo(rank=rank, master_address=host, master_port=free_port(host), world_size=world_size,
                                   packed=True, packed_buffer_size_bytes=bucket_bytes, packed_num_buffers=2)
    if backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return IPCTrainerInitInfo(rank=rank, packed=True, packed_buffer_size_bytes=bucket_bytes)
    raise ValueError(f"weight transfer backend {backend!r}: use nccl, ipc, gloo or shm")


class LocalTrainer:
    """The trainer engine in this process: one trainer rank, or rank 0 of a learner whose other ranks only join
    the gathers its source runs (nccl, gloo)."""

    world_size = 1

    def __init__(self, source: Any):
        self.source = source
        self.engine = None

    def open(self, make_info: Callable[[int], Any], client: Any) -> None:
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

        self.engine = WeightTransferTrainerFactory.trainer_init(make_info(0), client=client, source=self.source)

    def send(self) -> None:
        self.engine.send_weights()

    def close(self) -> None:
        engine, self.engine = self.engine, None
        close = getattr(self.source, "close", None)
        if close is not None:
            close()  # an unfinished pass still runs its gathers to the end
        if engine is not None:
            engine.shutdown()


class WeightPublisher:
    """Publishes versions of `source` (a vLLM WeightSource) to the ready replicas of a rollout application.

    `members()`: the ready replicas now; `store`: the WeightStore actor; `trainer`: where the trainer engine
    runs (LocalTrainer, or the learner's ranks for ipc/shm on a learner of several ranks)."""

    def __init__(self, backend: str, store: Any, members: Callable[[], Sequence[Member]], trainer: Any, *,
                 host: str = "127.0.0.1", bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout_s: float = 120.0):
        if trainer.world_size > 1 and backend not in ALL_RANK_BACKENDS:
            raise ValueError(f"{backend}: only rank 0 sends; give it a LocalTrainer over rank 0's source")
        self.backend, self.store, self.members_now, self.trainer = backend, store, members, trainer
        self.host, self.bucket_bytes, self.timeout_s = host, bucket_bytes, timeout_s
        self.client: ReplicaClient | None = None
        self.members: tuple[Member, ...] = ()

    def _open(self, members: Sequence[Member]) -> None:
        self.client = ReplicaClient(self.store, members, self.timeout_s,
                                    alive=lambda: [m.id for m in self.members_now()])
        world = 1 + self.client.workers

        def make_info(rank: int) -> Any:
            return trainer_init_info(self.backend, rank, host=self.host, world_size=world,
                                     bucket_bytes=self.bucket_bytes, timeout_s=self.timeout_s)

        self.members = tuple(members)
        self.trainer.open(make_info, self.client)

    def close(self) -> None:
        client, self.client, self.members = self.client, None, ()
        try:
            self.trainer.close()
        finally:
            if client is not None:
                try:
                    client.shutdown_weight_transfer_engine()
                except Exception as exc:  # a member already gone: nothing to shut down there
                    log.debug("weight group close: %s", exc)

    def publish(self, version: int) -> SyncResult:
        t0 = time.perf_counter()
        res = SyncResult(version, self.backend)
        for attempt in (1, 2):
            members = tuple(sorted(self.members_now(), key=lambda m: m.id))
            if not members:
                res.retried = res.retried or "no replica ready"
                return res
            try:
                if members != self.members or self.client is None:
                    self.close()
                    self._open(members)
                    res.formed = True
                self.client.version = version
                self.trainer.send()
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"[:300]
                log.warning("weights v%d by %s broke (%s)%s", version, self.backend, why,
                            "; forming the group again" if attempt == 1 else "")
                if self.client is not None:
                    self.client.abort()
                self.members = ()
                self.close()
                if attempt == 2 or not isinstance(exc, (WeightTransferError, RuntimeError, OSError)):
                    raise WeightTransferError(f"weights v{version} by {self.backend}: {why}") from exc
                res.retried = why
                continue
            res.replicas, res.receivers = len(members), dict(self.client.results)
            break
        res.seconds = time.perf_counter() - t0
        engine = getattr(self.trainer, "engine", None)
        source = getattr(self.trainer, "source", None)
        if source is not None:
            res.tensor_bytes = sum(m.nbytes for m in metas(source.metadata()))
            res.kind = getattr(source, "kind", "weights")
        last = getattr(engine, "last", None)
        res.bytes_sent = getattr(last, "bytes", 0) or getattr(engine, "last_bytes", 0)
        self.store.set_version.remote(version)
        return res
