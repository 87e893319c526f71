"""The actor the driver and the replicas meet at, and a replica's wait for the weights a request needs.

`WeightStore` (a named Ray actor on the driver's node) holds the register of replicas (where each runs,
whether its engine is up, the weights version it holds), the newest published version, and the command
channel of weight transfers: the driver's client posts each phase (rlscale.rollout.transfer.control), every
replica takes it with a long poll and answers. Weights themselves never pass through it: they move through
vLLM's weight transfer engines (rlscale.rollout.transfer).
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

import ray
import torch


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=64)
class WeightStore:
    """The register of replicas, the published version, and the weight-transfer command channel.

    A threaded actor: replicas wait in next() for the driver's next phase while the driver posts and reads
    answers, so every method takes the one condition's lock."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._version: int | None = None
        self._replicas: dict[str, dict[str, Any]] = {}
        self._engine: dict[str, Any] | None = None  # what the app's replicas run (set by the deployer)
        self._seq = 0
        self._cmds: list[tuple[int, str, dict[str, Any]]] = []  # (seq, op, {replica: payload}), recent ones
        self._acks: dict[int, dict[str, dict[str, Any]]] = {}
        self._loads: list[tuple[str, int, float]] = []  # (replica, version, seconds) per finished update

    # ------------------------------------------------------------------ versions and the register

    def set_version(self, version: int) -> None:
        with self._cv:
            self._version = version

    def version(self) -> int | None:
        return self._version

    def register(self, replica: str, info: dict[str, Any]) -> None:
        """A replica says where it starts (pod, Serve actor), then that its engine is up (`ready`, its
        workers, its weights version) and that it serves (`serving`)."""
        with self._cv:
            self._replicas[replica] = {**self._replicas.get(replica, {}), **info}

    def unregister(self, replica: str) -> None:
        with self._cv:
            self._replicas.pop(replica, None)

    def replicas(self) -> dict[str, dict[str, Any]]:
        with self._cv:
            return {k: dict(v) for k, v in self._replicas.items()}

    def set_engine(self, engine: dict[str, Any]) -> None:
        self._engine = dict(engine)

    def engine(self) -> dict[str, Any] | None:
        return self._engine

    def loaded(self, replica: str, version: int, seconds: float) -> None:
        with self._cv:
            self._loads.append((replica, version, seconds))
            if replica in self._replicas:
                self._replicas[replica]["version"] = version

    def loads(self) -> list[tuple[str, int, float]]:
        return list(self._loads)

    # ------------------------------------------------------------------ the command channel

    def post(self, op: str, payloads: dict[str, Any]) -> int:
        with self._cv:
            self._seq += 1
            self._cmds = [c for c in self._cmds if c[0] > self._seq - 64] + [(self._seq, op, dict(payloads))]
            self._acks = {s: a for s, a in self._acks.items() if s > self._seq - 64}
            self._acks[self._seq] = {}
            self._cv.notify_all()
            return self._seq

    def last_seq(self) -> int:
        return self._seq

    def next(self, replica: str, after: int, timeout_s: float) -> tuple[int, str, Any] | None:
        """The first phase after `after` addressed to `replica` (waiting up to timeout_s), or None."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while True:
                for seq, op, payloads in self._cmds:
                    if seq > after and replica in payloads:
                        return seq, op, payloads[replica]
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cv.wait(left)

    def ack(self, seq: int, replica: str, error: str | None, result: Any = None) -> None:
        with self._cv:
            if seq in self._acks:
                self._acks[seq][replica] = {"error": error, "result": result}

    def acks(self, seq: int) -> dict[str, dict[str, Any]]:
        with self._cv:
            return dict(self._acks.get(seq, {}))


def wait_for_version(engine: Any, need: int, timeout_s: float) -> None:
    """Block until `engine` holds weights version `need` or newer (a transfer in progress lands them)."""
    deadline = time.monotonic() + timeout_s
    while engine.version < need:
        if time.monotonic() > deadline:
            raise RuntimeError(f"a request needs weights version {need} but this replica holds {engine.version}; "
                               "the driver publishes each version to every ready replica")
        time.sleep(0.02)


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
