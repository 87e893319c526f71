"""The replica's side of the weights, and the actor the driver and the replicas meet at.

`WeightStore` (a named Ray actor on the driver's node) holds the newest published weights (one
ObjectRef), the register of replicas, the newest weight group's announcement and the driver's
sleep/wake request. `ReplicaSync` keeps one replica's engine current: from the object store (on
demand for a request, and ahead of demand from its thread) and from the driver's broadcasts
(rlscale.rollout.weight_sync); its thread also carries out sleep/wake (colocated placement).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import ray
import torch

from rlscale.rollout.weight_sync import Receiver, WeightSyncError

log = logging.getLogger(__name__)


@ray.remote(num_cpus=0, max_restarts=0)
class WeightStore:
    """Holds the newest published weights (one ObjectRef) and a register of replicas."""

    def __init__(self) -> None:
        self._version: int | None = None
        self._refs: list[ray.ObjectRef] = []
        self._replicas: dict[str, dict[str, Any]] = {}
        self._engine: dict[str, Any] | None = None  # what the app's replicas run (set by the deployer)
        self._group: dict[str, Any] | None = None  # the newest weight group's announcement
        self._awake: tuple[int, bool] = (0, True)  # the driver's newest sleep/wake request and its number
        self._awake_acks: set[str] = set()  # replicas that carried it out
        self._loads: list[tuple[str, int, str, float]] = []  # (replica, version, source, seconds) per load

    def publish(self, version: int, refs: list[ray.ObjectRef]) -> None:
        # refs arrive wrapped in a list so Ray hands us the reference, not the tensors.
        if self._version is not None and version <= self._version:
            raise ValueError(
                f"weights version {version} is not newer than the published {self._version}; "
                "publish increasing versions"
            )
        self._version, self._refs = version, list(refs)  # dropping old refs frees them

    def latest(self) -> tuple[int | None, list[ray.ObjectRef]]:
        return self._version, self._refs

    def version(self) -> int | None:
        return self._version

    def register(self, replica: str, info: dict[str, Any]) -> None:
        """A replica says where it starts (pod, Serve actor), then that it is up: pid, node, the
        version it started with, metrics URL (`serving`)."""
        self._replicas[replica] = info

    def unregister(self, replica: str) -> None:
        self._replicas.pop(replica, None)

    def replicas(self) -> dict[str, dict[str, Any]]:
        return dict(self._replicas)

    def set_engine(self, engine: dict[str, Any]) -> None:
        self._engine = dict(engine)

    def engine(self) -> dict[str, Any] | None:
        return self._engine

    # The weight group and sleep/wake (rlscale.rollout.weight_sync): what the replicas' sync threads poll.
    def announce(self, group: dict[str, Any]) -> None:
        self._group = dict(group)

    def control(self) -> dict[str, Any]:
        return {"group": self._group, "awake": self._awake, "version": self._version}

    def set_awake(self, awake: bool) -> int:
        self._awake, self._awake_acks = (self._awake[0] + 1, bool(awake)), set()
        return self._awake[0]

    def ack_awake(self, replica: str, seq: int) -> None:
        if seq == self._awake[0]:
            self._awake_acks.add(replica)

    def awake_acks(self) -> list[str]:
        return sorted(self._awake_acks)

    def loaded(self, replica: str, version: int, source: str, seconds: float = 0.0) -> None:
        self._loads.append((replica, version, source, seconds))  # a replica loaded `version` from `source`

    def loads(self) -> list[tuple[str, int, str, float]]:
        return list(self._loads)



class ReplicaSync:
    """A replica's weights, kept current from two sources: broadcasts of the group the driver formed, and
    the object store (on demand for a request, ahead of demand from a background thread). Also carries
    out the driver's sleep/wake requests (colocated placement)."""

    def __init__(self, replica: Any, poll_s: float = 0.25):
        self.r = replica  # RolloutReplica: .engine, .store (WeightStore), .replica_id, .metrics
        self.poll_s = poll_s
        self.lock = threading.RLock()  # one weight load at a time, whichever source
        self.store_version: int | None = None  # the last published version loaded (either source)
        self.lost: int | None = None
        self.receiver: Receiver | None = None
        self.group_key: tuple | None = None  # the newest group announced (joined or not)
        self.awake_seq = 0
        self.asleep = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ object store

    def pull(self, need: int | None, wait_s: float) -> None:
        """Load the store's newest weights if newer than ours; wait up to `wait_s` for `need`."""
        engine = self.r.engine
        deadline = time.monotonic() + wait_s
        while True:
            version, refs = ray.get(self.r.store.latest.remote())
            with self.lock:
                # Published weights win over the model directory's even at the same version
                # number: the learner's copy is the truth (a resumed run's differ).
                if version is not None and (version > engine.version
                                            or (version == engine.version and self.store_version is None)):
                    t0 = time.perf_counter()
                    try:
                        named_tensors = ray.get(refs[0])
                    except ray.exceptions.ObjectLostError:
                        # Its publisher exited (a kept app outlives each driver): the next driver
                        # publishes its own weights before its first request; wait for those.
                        if self.lost != version:
                            log.warning("weights version %s were lost with their publisher; waiting for newer",
                                        version)
                            self.lost = version
                    else:
                        self.load(named_tensors, version, "object-store", t0)
                        del named_tensors
            if need is None or engine.version >= need:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"a request needs weights version {need} but the newest published is "
                    f"{version}; call RolloutClient.publish_weights({need}, ...) first")
            time.sleep(0.05)

    def load(self, named_tensors, version: int, source: str, t0: float | None = None) -> None:
        """Load `version` into the engine; `t0`: when getting the weights began (the register's seconds)."""
        with self.lock:
            t1 = time.perf_counter()
            self.r.engine.load_weights(named_tensors, version)
            self.store_version = version
            t2 = time.perf_counter()
            self.r.metrics.weight_load_seconds.observe(t2 - t1)
            self.r.metrics.weights_version.set(version)
        try:
            self.r.store.loaded.remote(self.r.replica_id, version, source, t2 - (t1 if t0 is None else t0))
        except Exception:  # the register is a report
            pass

    # ------------------------------------------------------------------ background thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rlscale-weight-sync", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        next_control = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_control:
                    self._control(ray.get(self.r.store.control.remote(), timeout=30))
                    next_control = time.monotonic() + self.poll_s
                if self.receiver is not None:
                    self._maybe_receive()
            except Exception as exc:  # never let the thread die: the object store still serves
                log.warning("weight sync: %s: %s", type(exc).__name__, exc)
                self._leave()
                next_control = time.monotonic() + self.poll_s
            self._stop.wait(0.01 if self.receiver is not None else self.poll_s)

    def _control(self, ctl: Mapping[str, Any]) -> None:
        awake_seq, awake = ctl.get("awake", (0, True))
        if awake_seq > self.awake_seq:
            self._set_awake(bool(awake))
            self.awake_seq = awake_seq
            self.r.store.ack_awake.remote(self.r.replica_id, awake_seq)
        ann = ctl.get("group")
        # A group is its sender's store and epoch (a later driver numbers its groups from 1 again).
        if ann and (key := (ann["host"], ann["port"], ann["epoch"])) != self.group_key:
            self._leave()
            self.group_key = key
            if self.r.replica_id in ann["candidates"]:
                device = "cuda" if ann["backend"] == "nccl" else "cpu"
                rx = Receiver(ann, self.r.replica_id, device)
                log.info("weight group %s: %s", ann["epoch"], f"rank {rx.rank}" if rx.member else "left out")
                self.receiver = rx if rx.member else None
        newest = ctl.get("version")
        behind = newest is not None and (newest > self.r.engine.version or self.store_version is None)
        if behind and not self.asleep and newest != self.lost:
            self.pull(None, 0.0)  # ahead of demand: a replica outside the group catches up

    def _maybe_receive(self) -> None:
        rx = self.receiver
        version = rx.poll()
        if version is None:
            return
        try:
            t0 = time.perf_counter()
            items = rx.receive()
            self.load(items, version, "broadcast", t0)
        except Exception as exc:
            rx.ack(None, f"{type(exc).__name__}: {exc}"[:300])
            raise
        rx.ack(version, rx.transport.forward_error)  # an error: the ranks behind this one got nothing
        if rx.transport.forward_error is not None:
            raise WeightSyncError(f"forwarding to the next replica failed: {rx.transport.forward_error}")

    def _leave(self) -> None:
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None

    def _set_awake(self, awake: bool) -> None:
        method = getattr(self.r.engine, "wake_up" if awake else "sleep", None)  # no-ops on CPU
        if method is not None:
            with self.lock:
                method()
        self.asleep = not awake


def model_digest(worker) -> str:
    """sha256 over a vLLM worker's parameters and buffers, names and bytes (CPU's packed kernel copies
    are not parameters; the tests check those through generation)."""
    h = hashlib.sha256()
    model = worker.get_model()
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.numel():
            h.update(name.encode())
            h.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
