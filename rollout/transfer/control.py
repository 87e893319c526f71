"""The control plane of a weight transfer: the trainer engine's client, fanned out to every replica.

vLLM's trainer engines drive an update through a `VLLMWeightSyncClient` (init, start, update, finish).
Its stock clients talk to one engine (HTTP, or Ray actors); rlscale's engines are Ray Serve replicas that
come and go, so `ReplicaClient` posts each phase to the WeightStore actor and waits until every member
replica carried it out. Each replica runs the phases on its own engine (`ReplicaCommands`), in the order
posted, from a thread of its own: update_weights must run in every replica while the trainer sends.

The group's members are fixed per client. A replica's workers take consecutive ranks in the trainer's
group: replica i's rank offset is 1 plus the workers (tensor-parallel size) of the replicas before it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


class WeightTransferError(RuntimeError):
    """A phase failed on a replica, or a replica did not answer in time: the group is not usable again."""


@dataclass(frozen=True)
class Member:
    """A replica in a transfer group: its id and how many workers (TP x PP) its engine has."""

    id: str
    workers: int = 1


def member_init_infos(members: Sequence[Member], init_info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each member's init info: a group backend's (one with rank_offset) gives every replica's workers their own
    ranks after the trainer's, replica by replica; the others' is the same for all."""
    if "rank_offset" not in init_info:
        return {m.id: dict(init_info) for m in members}
    out, offset = {}, int(init_info["rank_offset"])
    for m in members:
        out[m.id] = {**init_info, "rank_offset": offset}
        offset += m.workers
    return out


ALIVE_EVERY_S = 2.0  # how often a waiting phase asks which members are still alive


def _alive_now(alive: Callable[[], Collection[str]]) -> set[str] | None:
    try:
        now = alive()
    except Exception as exc:  # no answer about liveness is no news: the phase's own timeout still holds
        log.debug("replica liveness: %s", exc)
        return None
    return None if now is None else set(now)


def wait_for_acks(op: str, expected: set[str], acks_now: Callable[[], Mapping[str, Mapping[str, Any]]],
                  timeout_s: float, alive: Callable[[], Collection[str]] | None = None,
                  alive_every_s: float = ALIVE_EVERY_S) -> dict[str, Any]:
    """Wait until every replica in `expected` answered `op` (acks_now(): replica -> its answer so far); their
    results. A failed answer, a member that is no longer alive, or timeout_s without every answer raise
    WeightTransferError. Without the liveness check, a replica killed between two updates (its pod deleted)
    held the next update for timeout_s, then its abort and the group's shutdown as long again: 6 minutes of
    a real-node run (tests/node/test_faults_k8s.py, the rollout pod's kill)."""
    start = time.monotonic()
    deadline, next_alive, wait = start + timeout_s, start + alive_every_s, 0.002
    while True:
        acks = acks_now()
        failed = {r: a["error"] for r, a in acks.items() if a.get("error")}
        if failed:
            r, err = sorted(failed.items())[0]
            raise WeightTransferError(f"replica {r}: {op} failed: {err}")
        if expected <= set(acks):
            return {r: acks[r].get("result") for r in expected}
        now = time.monotonic()
        if alive is not None and now >= next_alive:
            next_alive = now + alive_every_s
            live = _alive_now(alive)
            gone = sorted(expected - set(acks) - live) if live is not None else []
            if gone:
                raise WeightTransferError(f"{op}: replica(s) {', '.join(gone)} gone before answering")
        if now > deadline:
            missing = sorted(expected - set(acks))
            raise WeightTransferError(f"{op}: no answer from replica(s) {', '.join(missing)} in {timeout_s:.0f} s")
        time.sleep(wait)
        wait = min(wait * 2, 0.05)


class ReplicaClient:
    """vLLM's VLLMWeightSyncClient over the WeightStore: each call returns once every member did it."""

    def __init__(self, store: Any, members: Sequence[Member], timeout_s: float = 120.0,
                 alive: Callable[[], Collection[str]] | None = None):
        """`alive`: the ids of the replicas alive now (None where it cannot say), asked while a phase waits, so
        that a member that died ends the wait at once instead of after timeout_s, and abort and shutdown wait
        only for the members still there."""
        self.store, self.members, self.timeout_s, self.alive = store, list(members), timeout_s, alive
        self.version: int | None = None  # what finish_weight_update makes the members' weights version
        self.results: dict[str, Any] = {}  # the members' answers to the last call

    @property
    def workers(self) -> int:
        return sum(m.workers for m in self.members)

    def _call(self, op: str, payloads: Mapping[str, Any]) -> dict[str, Any]:
        import ray

        if not payloads:
            self.results = {}
            return self.results
        seq = ray.get(self.store.post.remote(op, dict(payloads)))
        self.results = wait_for_acks(op, set(payloads), lambda: ray.get(self.store.acks.remote(seq)),
                                     self.timeout_s, self.alive)
        return self.results

    def _all(self, op: str, payload: Any = None, live_only: bool = False) -> dict[str, Any]:
        members = self.members
        if live_only and self.alive is not None:
            now = _alive_now(self.alive)
            members = members if now is None else [m for m in members if m.id in now]
        return self._call(op, {m.id: payload for m in members})

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._call("init", member_init_infos(self.members, init_info))

    def start_weight_update(self) -> None:
        self._all("start")

    def update_weights(self, update_info: Any) -> None:
        self._all("update", update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        v = self.version if weight_version is None else int(weight_version)
        self._all("finish", {"version": v})

    def shutdown_weight_transfer_engine(self) -> None:
        self._all("shutdown", live_only=True)  # a replica that is gone has nothing left to shut down

    def abort(self) -> None:
        """Best effort after a broken update: members leave the update (their weights marked unusable until
        the next whole one) and close the group."""
        try:
            self._all("abort", live_only=True)
        except Exception as exc:
            log.warning("weight transfer abort: %s", exc)


class NullClient:
    """What a trainer rank other than the sender holds: vLLM's engines never call it there."""

    def _never(self, *_: Any, **__: Any) -> None:
        raise RuntimeError("only the sending trainer rank talks to the replicas")

    init_weight_transfer_engine = start_weight_update = update_weights = finish_weight_update = _never


class ReplicaCommands:
    """A replica's side: runs each posted phase on its engine, in order, from one thread, and answers.

    `engine` is a RolloutEngine: begin_update() takes its lock (no generation during an update) until
    end_update(version) or abort_update(). `on_version(v, stats)` reports each finished update."""

    def __init__(self, store: Any, replica_id: str, engine: Any, on_version=None, poll_s: float = 2.0):
        self.store, self.replica_id, self.engine = store, replica_id, engine
        self.on_version, self.poll_s = on_version, poll_s
        self.seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ReplicaCommands:
        import ray

        self.seq = ray.get(self.store.last_seq.remote())  # phases posted before this replica existed are not its
        self._thread = threading.Thread(target=self._run, name="rlscale-weight-commands", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        import ray

        while not self._stop.is_set():
            try:
                cmd = ray.get(self.store.next.remote(self.replica_id, self.seq, self.poll_s), timeout=self.poll_s + 30)
            except Exception as exc:  # the store is gone (the driver ended): look again later
                log.debug("weight commands: %s", exc)
                self._stop.wait(self.poll_s)
                continue
            if cmd is None:
                continue
            seq, op, payload = cmd
            self.seq = seq
            error, result = None, None
            try:
                result = self.run(op, payload)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"[:500]
                log.warning("weight transfer %s failed: %s", op, error)
                if op in ("start", "update", "finish"):
                    self.engine.abort_update()
            try:
                self.store.ack.remote(seq, self.replica_id, error, result)
            except Exception:  # the store went away with its driver
                pass

    def run(self, op: str, payload: Any) -> Any:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest, WeightTransferUpdateRequest

        e = self.engine
        if op == "init":
            e.llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=payload))
        elif op == "start":
            e.begin_update()
            e.llm.start_weight_update()
        elif op == "update":
            e.llm.update_weights(WeightTransferUpdateRequest(update_info=payload))
        elif op == "finish":
            e.llm.finish_weight_update()
            version = int(payload["version"])
            stats = e.end_update(version)
            if self.on_version is not None:
                self.on_version(version, stats)
            return stats
        elif op == "abort":
            e.abort_update()
            try:  # vLLM keeps a connection while an update is open: leave the update (its weights are unusable)
                e.llm.finish_weight_update()
            except Exception as exc:
                log.debug("abort: no update to leave (%s)", exc)
            e.llm.shutdown_weight_transfer_engine()
        elif op == "shutdown":
            e.llm.shutdown_weight_transfer_engine()
        elif op == "sleep":
            return e.sleep(level=int((payload or {}).get("level", 1)))
        elif op == "wake":
            return e.wake_up(tags=(payload or {}).get("tags"))
        else:
            raise ValueError(f"unknown weight command {op!r}")
        return None
