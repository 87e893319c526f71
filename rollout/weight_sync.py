"""Weights from the learner to every rollout replica by one collective stream, not one pull each.

The object-store path (RolloutClient.publish_weights with "object-store") puts the weights once and
every replica pulls the whole of them from rank 0's node: N replicas, N copies out of one pod. Here
the learner's rank 0 (the sender, rank 0 of its own group) and one receiver per replica form a
process group of their own, separate from the learner's default group that DeepSpeed uses: a
TCPStore the sender hosts on a free port, announced through the WeightStore actor, and
`ProcessGroupGloo` (CPU) or `ProcessGroupNCCL` (GPU) built on it directly, never through
`init_process_group`. Each update streams parameter by parameter, in the order the learner yields
them: the name, dtype and shape through the store, the bytes through the group.

The sender sends each byte once whatever the replica count: NCCL's broadcast is ring-pipelined;
on gloo the ranks form a chain (0 -> 1 -> ... -> n) and every tensor travels in chunks, each rank
forwarding chunk c to the next while it receives chunk c+1.

Membership is fixed per group: the replicas serving when the driver forms it, minus those that do
not answer within `form_timeout_s`. A change of the serving set re-forms it at the next publish.
A replica outside the group (joined later, restarted, did not answer, lost the stream) catches up
from the object store, which keeps the newest weights as before. Every wait has a timeout, and a
broken stream never stops the sender from consuming the learner's iterator (ZeRO-3 gathers each
parameter collectively: every rank must go through all of them).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger(__name__)

MODES = ("auto", "broadcast", "object-store")
CHUNK_BYTES = 4 * 2**20
_END, _ABORT = "end", "abort"


class WeightSyncError(RuntimeError):
    """A broadcast that had to happen ("broadcast" mode) could not: the step fails, the run restarts."""


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"weight_sync: {mode!r}; use one of {', '.join(MODES)}")
    return mode


def named_items(named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> Iterable[tuple[str, Any]]:
    """(name, tensor) pairs from a dict (export_weights) or an iterable of pairs (iter_weights)."""
    return named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor (gloo moves bytes; any dtype travels alike)."""
    return t.reshape(-1).view(torch.uint8)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise WeightSyncError(f"unknown dtype {name!r} in a weight update")
    return dtype


def _td(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def group_backend(num_gpus: float) -> str:
    """nccl where the replicas have GPUs and this process sees one, else gloo."""
    return "nccl" if num_gpus and torch.cuda.is_available() else "gloo"


def open_group(store, rank: int, size: int, backend: str, timeout_s: float):
    """A process group on `store` alone: no default group is created or touched."""
    prefix = torch.distributed.PrefixStore("pg", store)
    if backend == "gloo":
        return torch.distributed.ProcessGroupGloo(prefix, rank, size, _td(timeout_s))
    if backend == "nccl":
        return torch.distributed.ProcessGroupNCCL(prefix, rank, size, _td(timeout_s))
    raise ValueError(f"backend {backend!r}: use gloo or nccl")


class Transport:
    """Moves one tensor from rank 0 to every other rank of the group; counts the bytes this rank sends."""

    def __init__(self, pg, rank: int, size: int, backend: str, chunk_bytes: int = CHUNK_BYTES,
                 timeout_s: float = 120.0):
        self.pg, self.rank, self.size, self.backend = pg, rank, size, backend
        self.chunk_bytes, self.timeout = max(1, int(chunk_bytes)), _td(timeout_s)
        self.bytes_sent = 0
        self.forward_error: str | None = None  # gloo: the next rank stopped taking chunks (then none is sent)

    def _chunks(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [flat[i:i + self.chunk_bytes] for i in range(0, flat.numel(), self.chunk_bytes)]

    def _wait(self, works: list) -> None:
        for w in works:
            w.wait(self.timeout)

    def send(self, t: torch.Tensor) -> None:
        """Rank 0: every byte of `t` goes out once (to rank 1, or into NCCL's ring)."""
        if self.backend == "nccl":
            self._nccl(t)
        else:
            self._wait([self.pg.send([c], 1, 0) for c in self._chunks(as_bytes(t))])
        self.bytes_sent += t.numel() * t.element_size()

    def recv(self, buf: torch.Tensor) -> None:
        """Ranks 1..n: fill `buf`; on gloo forward each chunk to the next rank as soon as it arrives."""
        if self.backend == "nccl":
            self._nccl(buf)
            return
        pending = []
        for c in self._chunks(as_bytes(buf)):
            self.pg.recv([c], self.rank - 1, 0).wait(self.timeout)
            if self.rank + 1 < self.size and self.forward_error is None:
                try:
                    pending.append(self.pg.send([c], self.rank + 1, 0))
                    self.bytes_sent += c.numel()
                except Exception as exc:
                    self.forward_error = f"{type(exc).__name__}: {exc}"[:300]
        try:
            self._wait(pending)
        except Exception as exc:  # the next rank is gone: this one still has its tensor, the chain ends here
            self.forward_error = f"{type(exc).__name__}: {exc}"[:300]

    def _nccl(self, t: torch.Tensor) -> None:
        opts = torch.distributed.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        self.pg.broadcast([t], opts).wait(self.timeout)


@dataclass
class SyncResult:
    """What one publish did: the driver logs `describe()`; the bench reads the figures."""

    version: int
    method: str  # "broadcast" or "object-store"
    replicas: int = 0  # replicas that hold the version now by the broadcast
    fallback: list[str] = field(default_factory=list)  # replicas left to the object store (ids)
    seconds: float = 0.0  # the whole publish
    broadcast_seconds: float = 0.0
    put_seconds: float = 0.0
    tensor_bytes: int = 0  # the weights' size
    bytes_sent: int = 0  # by the learner's process into the group (0 on the object-store path)
    reason: str = ""  # why it is not (only) a broadcast

    def describe(self) -> str:
        if self.method == "broadcast":
            s = (f"weights v{self.version} by broadcast to {self.replicas} replica"
                 f"{'s' if self.replicas != 1 else ''} in {self.seconds:.2f} s "
                 f"({self.tensor_bytes / 2**20:.1f} MiB sent once)")
            if self.fallback:
                s += f"; {len(self.fallback)} catch up from the object store"
            return s + (f" ({self.reason})" if self.reason else "")
        why = f" ({self.reason})" if self.reason else ""
        return f"weights v{self.version} by object store in {self.seconds:.2f} s{why}"


class Sender:
    """Rank 0 of a weight group: hosts its store, forms it from the replicas that answer, streams updates."""

    def __init__(self, host: str, backend: str = "gloo", timeout_s: float = 120.0, form_timeout_s: float = 30.0,
                 chunk_bytes: int = CHUNK_BYTES):
        self.host, self.backend, self.timeout_s = host, backend, timeout_s
        self.form_timeout_s, self.chunk_bytes = form_timeout_s, chunk_bytes
        self.epoch = 0
        self.asked: tuple[str, ...] = ()  # the replicas the newest formation asked
        self.members: list[str] = []  # those in the group, rank i + 1 each
        self.store = self.pg = self.transport = None
        self.seq = 0
        self.broken: str | None = None  # why the group cannot be used again

    @property
    def ready(self) -> bool:
        return self.pg is not None and self.broken is None

    def form(self, replicas: Iterable[str], announce: Callable[[dict], Any]) -> list[str]:
        """Ask `replicas` to join (through `announce`, i.e. the WeightStore); the group is those that
        answer within form_timeout_s. Returns its members."""
        self.close()
        self.epoch += 1
        self.asked = tuple(sorted(replicas))
        self.store = torch.distributed.TCPStore(self.host, 0, None, True, _td(self.timeout_s),
                                                wait_for_workers=False)
        announce({"epoch": self.epoch, "host": self.host, "port": self.store.port, "candidates": list(self.asked),
                  "backend": self.backend, "timeout_s": self.timeout_s, "chunk_bytes": self.chunk_bytes,
                  "form_timeout_s": self.form_timeout_s})
        deadline = time.monotonic() + self.form_timeout_s
        joined: list[str] = []
        while True:
            joined = [r for r in self.asked if self.store.check([f"hello/{r}"])]
            if len(joined) == len(self.asked) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        self.store.set("go", json.dumps(joined))
        self.members = joined
        if joined:
            self.pg = open_group(self.store, 0, len(joined) + 1, self.backend, self.timeout_s)
            self.transport = Transport(self.pg, 0, len(joined) + 1, self.backend, self.chunk_bytes, self.timeout_s)
        return joined

    def broadcast(self, version: int, items: Iterable[tuple[str, Any]],
                  keep: Callable[[str, torch.Tensor], None] | None = None) -> list[str]:
        """Stream every (name, tensor) to the members; `keep` sees each (CPU) tensor as it goes (the
        object-store copy). Consumes `items` to the end even when the stream breaks. Returns the
        members that acknowledged loading `version`."""
        assert self.ready, "form the group first"
        self.seq += 1
        seq, store, i = self.seq, self.store, 0
        store.set(f"u/{seq}", json.dumps({"version": version}))
        for name, t in items:
            t = t.detach()
            t = (t.cuda() if self.backend == "nccl" else t.cpu()).contiguous()
            if self.broken is None:
                announced = False
                try:
                    store.set(f"u/{seq}/{i}", json.dumps([name, str(t.dtype), list(t.shape)]))
                    announced = True
                    self.transport.send(t)
                except Exception as exc:  # a member died or stalled: the rest go by the object store
                    self.broken = f"{type(exc).__name__}: {exc}"[:300]
                    log.warning("weight broadcast v%s broke at %s: %s", version, name, self.broken)
                    self._abort(f"u/{seq}/{i + announced}")  # the name the members wait for next
            if keep is not None:
                keep(name, t if t.device.type == "cpu" else t.cpu())
            i += 1
        if self.broken is not None:
            return []
        store.set(f"u/{seq}/{i}", _END)
        return self._acks(seq, version)

    def _abort(self, key: str) -> None:
        try:  # members waiting for the next tensor's name stop at once instead of at their timeout
            self.store.set(key, _ABORT)
        except Exception:
            pass

    def _acks(self, seq: int, version: int) -> list[str]:
        """The members that loaded `version`. Waits for each member's answer, but on a gloo chain not for
        those behind a member that could not forward (nothing reaches them)."""
        keys = {n + 1: f"ack/{seq}/{n + 1}" for n in range(len(self.members))}
        acks: dict[int, dict] = {}
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            acks.update({rank: json.loads(self.store.get(k)) for rank, k in keys.items()
                         if rank not in acks and self.store.check([k])})
            cut = min([rank for rank, a in acks.items() if a.get("error")] + [len(keys)])
            if self.backend == "nccl":
                cut = len(keys)
            if all(rank in acks for rank in range(1, cut + 1)):
                break
            time.sleep(0.01)
        ok = [r for n, r in enumerate(self.members) if acks.get(n + 1, {}).get("version") == version]
        if len(ok) < len(self.members):
            self.broken = f"{len(self.members) - len(ok)} of {len(self.members)} members did not load v{version}"
        return ok

    @property
    def bytes_sent(self) -> int:
        return self.transport.bytes_sent if self.transport is not None else 0

    def close(self) -> None:
        self.pg = self.transport = None
        self.store, self.members, self.broken, self.seq = None, [], None, 0


class Receiver:
    """One replica's side of a weight group (rank >= 1)."""

    def __init__(self, announcement: Mapping[str, Any], replica_id: str, device: str = "cpu"):
        a = dict(announcement)
        self.epoch, self.replica_id, self.device = int(a["epoch"]), replica_id, device
        self.backend, self.timeout_s, self.chunk_bytes = a["backend"], float(a["timeout_s"]), int(a["chunk_bytes"])
        self.store = torch.distributed.TCPStore(a["host"], int(a["port"]), None, False, _td(self.timeout_s))
        self.store.set(f"hello/{replica_id}", "1")
        self.store.set_timeout(_td(float(a.get("form_timeout_s", 30.0)) + 10.0))
        members = json.loads(self.store.get("go"))
        self.store.set_timeout(_td(self.timeout_s))
        self.rank = members.index(replica_id) + 1 if replica_id in members else None
        self.pg = self.transport = None
        if self.rank is not None:
            size = len(members) + 1
            self.pg = open_group(self.store, self.rank, size, self.backend, self.timeout_s)
            self.transport = Transport(self.pg, self.rank, size, self.backend, self.chunk_bytes, self.timeout_s)
        self.seq = 0

    @property
    def member(self) -> bool:
        return self.rank is not None

    def poll(self) -> int | None:
        """The version of the next update when the sender has started one, else None."""
        key = f"u/{self.seq + 1}"
        if not self.store.check([key]):
            return None
        self.seq += 1
        return int(json.loads(self.store.get(key))["version"])

    def receive(self) -> list[tuple[str, torch.Tensor]]:
        """The update's tensors, in the sender's order, each in a buffer of its own."""
        items, i = [], 0
        while (meta := self.store.get(f"u/{self.seq}/{i}").decode()) != _END:
            if meta == _ABORT:
                raise WeightSyncError(f"the sender gave up update {self.seq} at tensor {i}")
            name, dtype, shape = json.loads(meta)
            buf = torch.empty(shape, dtype=_dtype(dtype), device=self.device)
            self.transport.recv(buf)
            items.append((name, buf))
            i += 1
        return items

    def ack(self, version: int | None, error: str | None = None) -> None:
        self.store.set(f"ack/{self.seq}/{self.rank}", json.dumps({"version": version, "error": error}))

    def close(self) -> None:
        self.pg = self.transport = self.store = None


class Publisher:
    """The driver's side of publishing: by the group where it can, always into the object store.

    `members()`: the replicas serving now (ids); `announce(dict)`: tells them a group forms (the
    WeightStore); `put(version, tensors)`: the object-store copy, published as `version`. The group is
    re-formed when the serving set changes; replicas that did not answer a formation are left to the
    object store until the set changes again."""

    def __init__(self, mode: str, members: Callable[[], Iterable[str]], announce: Callable[[dict], Any],
                 put: Callable[[int, dict], None], sender: Sender | None = None, put_behind: bool = True):
        self.mode = check_mode(mode)
        self.members, self.announce, self.put = members, announce, put
        self.sender = sender
        self._asked: tuple[str, ...] | None = None  # the serving set the newest formation was for
        # After a broadcast the object-store copy is only for replicas outside the group (they wait for it):
        # it is put by a thread while the driver goes on, one at a time, in version order.
        self.put_behind = put_behind
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlscale-weights-put")
        self._putting: concurrent.futures.Future | None = None

    def flush(self) -> None:
        """Wait for the object-store copy still being put (raises what putting it raised)."""
        pending, self._putting = self._putting, None
        if pending is not None:
            pending.result()

    def publish(self, version: int, named_tensors) -> SyncResult:
        self.flush()
        t0 = time.perf_counter()
        kept: dict[str, torch.Tensor] = {}
        res = SyncResult(version, "object-store")
        if self.mode != "object-store" and self.sender is not None:
            self._broadcast(version, named_items(named_tensors), kept, res)
        if res.method == "object-store":
            for name, t in named_items(named_tensors) if not kept else ():
                kept[name] = t.detach().cpu() if hasattr(t, "detach") else t
        res.tensor_bytes = sum(t.numel() * t.element_size() for t in kept.values() if hasattr(t, "numel"))
        if res.method == "broadcast" and self.put_behind:
            self._putting = self._pool.submit(self.put, version, kept)
        else:
            t1 = time.perf_counter()
            self.put(version, kept)
            res.put_seconds = time.perf_counter() - t1
        res.seconds = time.perf_counter() - t0
        return res

    def _broadcast(self, version: int, items, kept: dict, res: SyncResult) -> None:
        s = self.sender
        serving = tuple(sorted(self.members()))
        if not serving:
            res.reason = "no replica serves"
            return None
        # Formed again when the serving set changed, or when the group broke in use; a formation that found
        # nobody is not tried again for the same set (each try waits form_timeout_s).
        if serving != self._asked or (not s.ready and s.broken):
            why = "first" if self._asked is None else ("members changed" if serving != self._asked else s.broken)
            try:
                joined = s.form(serving, self.announce)
            except Exception as exc:
                s.close()
                joined, why = [], f"{why}; forming failed: {type(exc).__name__}: {exc}"
            self._asked = serving
            log.info("weight group %d formed (%s): %d of %d replicas", s.epoch, why, len(joined), len(serving))
        if not s.ready:
            res.reason, res.fallback = "the group could not form", list(serving)
            return self._refuse(res)
        t0 = time.perf_counter()
        bytes0 = s.bytes_sent
        ok = s.broadcast(version, items, keep=kept.__setitem__)
        res.broadcast_seconds = time.perf_counter() - t0
        res.bytes_sent = s.bytes_sent - bytes0
        res.fallback = [r for r in serving if r not in ok]
        if not ok:
            res.reason = s.broken or "no member loaded the update"
            return self._refuse(res)
        res.method, res.replicas = "broadcast", len(ok)
        if s.broken:
            res.reason = s.broken

    def _refuse(self, res: SyncResult) -> None:
        if self.mode == "broadcast":
            raise WeightSyncError(f"weights v{res.version}: broadcast required (rollout.weightSync: broadcast) "
                                  f"but {res.reason}")
