"""The learner ranks watch each other, so one that dies takes the gang down with it.

Without this, a rank that crashes (OOM, a node lost) leaves the others blocked in a collective
until the process group's timeout (30 minutes by default), holding their accelerators, and a
restarted rank 0 cannot rendezvous with followers still bound to its predecessor. With it,
the survivors exit within seconds and the StatefulSet starts every rank again, which resume
together from the last checkpoint.

How: a second client of the process group's TCP store (served by rank 0's process).
Followers bump a heartbeat counter every `interval` seconds and read rank 0's boot id; rank 0
checks that every follower's counter moves. A follower whose store calls fail, find a new boot
id or go unanswered for `patience` seconds (rank 0's process hangs or its node is cut off), or a
rank 0 that sees a follower's counter stand still for `patience` seconds, exits with EXIT_GANG.

Each follower also publishes a boot id of its own, and rank 0 exits when one changes: a follower
that died and came back within the patience (its pod's container restarted) finds rank 0's store
still up and bumps the same counter, so the counter alone would look alive while rank 0 waits on
the dead process's half of a collective until the process group's timeout.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from datetime import timedelta

log = logging.getLogger("rlscale.gang")

EXIT_GANG = 75  # EX_TEMPFAIL: restart me, the gang is broken
_PREFIX = "rlscale/gang/"


def _store_client(host: str, port: int, timeout: float):
    """A client of rank 0's TCP store, beside the process group's own (which it does not count as a worker)."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout), wait_for_workers=False)


class _NoAnswer(Exception):
    pass


def _within(call, limit: float):
    """call()'s value (or its exception), from a thread of its own; _NoAnswer when it has not returned within
    `limit` seconds. A TCPStore call to a rank 0 whose process is frozen (SIGSTOP) or whose node is cut off
    never returns, whatever the client's timeout (tests/trainer/test_gang_watch.py), so a follower judging
    rank 0 from inside the call would wait with it; the stuck thread is left behind, and the exit follows."""
    box: list = []

    def run() -> None:
        try:
            box.append((True, call()))
        except BaseException as exc:  # handed to the watch as it is
            box.append((False, exc))

    t = threading.Thread(target=run, name="gang-watch-call", daemon=True)
    t.start()
    t.join(limit)
    if not box:
        raise _NoAnswer
    ok, value = box[0]
    if not ok:
        raise value
    return value


class _Watch:
    """A daemon thread that ends the process with EXIT_GANG when what it watches is gone."""

    # How long stop() waits for the thread. A store call to a live rank 0 answers in milliseconds, one to a
    # dead rank 0 fails at once; one to a frozen rank 0 (SIGSTOP) blocks whatever the client's timeout
    # (measured: add, get and check were still in the call after 12 s with a 2 s timeout), and no wait helps.
    join_timeout = 10.0

    def __init__(self, interval: float, patience: float, exit_fn=None):
        self.interval, self.patience = interval, patience
        self._exit = exit_fn or os._exit
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def stop(self) -> None:
        """End the watch and wait for its thread. The wait matters at the process's end: a daemon thread
        still inside a torch or Ray C++ call when the interpreter finalizes is ended as it returns into
        Python, through a frame that may not unwind, and the process aborts ("terminate called without an
        active exception", exit -6) after a run that succeeded, as two CI runs' 2-rank learner tests ended
        (tests/trainer/test_gang_watch.py reproduces that end without the wait)."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(self.join_timeout)
            if t.is_alive():
                log.warning("the %s thread is still in a call %.0f s after stop()", t.name, self.join_timeout)

    @property
    def stopped(self) -> bool:
        """stop() was called: the gang was released on purpose (the run has ended)."""
        return self._stop.is_set()

    def _leave(self, message: str) -> None:
        """Log why and exit, unless the watch was stopped (an end on purpose)."""
        if self._stop.is_set():
            return
        log.error("%s; exiting (%d) to restart and resume from the last checkpoint", message, EXIT_GANG)
        self._exit(EXIT_GANG)


class GangWatch(_Watch):
    """Start with start(); stop() ends the watch (a clean shutdown of the whole gang)."""

    def __init__(self, rank: int, world_size: int, host: str, port: int, interval: float = 5.0,
                 patience: float = 30.0, exit_fn=None):
        super().__init__(interval, patience, exit_fn)
        self.rank, self.world_size = rank, world_size
        self.host, self.port = host, port
        self._store = None
        self.boot = ""

    def _client(self):
        return _store_client(self.host, self.port, max(5.0, self.interval))

    def start(self) -> None:
        """Rank 0 publishes its boot id; followers read it. Call on every rank after the
        process group is up (it needs rank 0's store) and before any rank can fail."""
        if self.world_size <= 1:
            return
        self._store = self._client()
        if self.rank == 0:
            self.boot = secrets.token_hex(8)
            self._store.set(_PREFIX + "boot", self.boot)
        else:
            self._store.wait([_PREFIX + "boot"], timedelta(seconds=120))
            self.boot = self._store.get(_PREFIX + "boot").decode()
            self._store.set(f"{_PREFIX}proc/{self.rank}", secrets.token_hex(8))  # this process, for rank 0
        target = self._watch_followers if self.rank == 0 else self._watch_rank0
        self._thread = threading.Thread(target=target, name="gang-watch", daemon=True)
        self._thread.start()

    def _gone(self, why: str) -> None:
        self._leave(f"rank {self.rank}: {why}; every rank restarts")

    def _watch_rank0(self) -> None:
        failures = 0
        beat = f"{_PREFIX}beat/{self.rank}"

        def beat_and_read() -> str:
            self._store.add(beat, 1)
            return self._store.get(_PREFIX + "boot").decode()

        while not self._stop.wait(self.interval):
            try:
                boot = _within(beat_and_read, self.patience)
            except _NoAnswer:  # rank 0's process hangs, or its node is unreachable: no reset will come
                return self._gone(f"rank 0 has not answered for {self.patience:.0f} s")
            except Exception as exc:  # connection refused or reset, timeout: rank 0's process is gone
                failures += 1
                if failures >= 2:
                    return self._gone(f"rank 0 does not answer ({type(exc).__name__})")
                continue
            failures = 0
            if boot != self.boot:
                return self._gone("rank 0 restarted (a new boot id)")

    def _watch_followers(self) -> None:
        seen: dict[int, tuple[int, float]] = {}
        procs: dict[int, str] = {}
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            for r in range(1, self.world_size):
                key = f"{_PREFIX}proc/{r}"
                try:
                    n = self._store.add(f"{_PREFIX}beat/{r}", 0)
                    # check() does not block: a follower may not have published its id yet
                    proc = self._store.get(key).decode() if self._store.check([key]) else None
                except Exception as exc:
                    return self._gone(f"its own store failed ({type(exc).__name__})")
                if proc is not None and procs.setdefault(r, proc) != proc:
                    return self._gone(f"rank {r} restarted (a new process)")
                last = seen.get(r)
                if last is None or n != last[0]:
                    seen[r] = (n, now)
                elif now - last[1] > self.patience:
                    return self._gone(f"rank {r} stopped its heartbeat {now - last[1]:.0f} s ago")


def leave_the_previous_gang(rank: int, world_size: int, host: str, port: int, poll: float = 1.0,
                            limit: float = 600.0, connect_timeout: float = 5.0) -> None:
    """A follower's first act, before it joins the process group: make sure rank 0's store at host:port
    is a new one, not the previous rank 0's.

    A follower whose container restarted may start while the previous rank 0 is still alive (it learns of
    the death at its next collective, seconds later), and its store still answers. The follower then
    joins that dying gang and waits for the rest of the new group's rendezvous forever, while the new rank
    0 waits for it (the real-node faults run, stop 49: both ranks of the killed-learner episode hung in
    init_process_group). The store of a gang that is up holds rank 0's boot id (GangWatch.start); a new
    rank 0 publishes it only once the group is up. So while the boot id is there, this follower announces
    its new process to that rank 0 (whose watch then exits within its interval) and waits for the store to
    go; when it finds no store, or one without a boot id, it goes on to the rendezvous."""
    if rank == 0 or world_size <= 1:
        return
    deadline = time.monotonic() + limit
    announced = False
    while True:
        try:
            store = _store_client(host, port, connect_timeout)
            if not store.check([_PREFIX + "boot"]):
                return  # a new rank 0's store (or one still starting): the rendezvous is this gang's
            if not announced:
                store.set(f"{_PREFIX}proc/{rank}", secrets.token_hex(8))
                log.warning("rank %d: rank 0's store at %s:%d is the previous gang's (rank 0 has not yet seen "
                            "this rank restart); told it, waiting for it to go before joining", rank, host, port)
                announced = True
        except Exception:  # no store there, or it went away mid-call: the previous rank 0 is gone
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"learner rank {rank}: the previous gang's rank 0 still serves its store at "
                               f"{host}:{port} after {limit:.0f} s; this rank cannot join a new one")
        time.sleep(poll)


_HEAD_WATCHES: list[HeadWatch] = []


def stop_head_watches() -> None:
    """The run has ended: the head going away (scaled to zero with the rest) is expected now."""
    for w in _HEAD_WATCHES:
        w.stop()


class HeadWatch(_Watch):
    """Rank 0 in a pod watches the run's Ray head, and exits with EXIT_GANG when it is gone.

    A Ray head that is killed comes back as a new pod behind the same Service: a new cluster,
    with a new cluster id. The driver does not notice (measured on the real node: its calls to
    the replicas hang, its raylet stays up, no step for minutes), so this watch asks the head's
    GCS for its cluster id every `interval` seconds; a different id, or no answer for
    `patience` seconds, ends the process, and the restarted pod joins the new head and resumes
    from the last checkpoint (`tests/node/test_faults_k8s.py`). `probe` returns the id (hex)."""

    def __init__(self, probe, interval: float = 10.0, patience: float = 120.0, exit_fn=None):
        super().__init__(interval, patience, exit_fn)
        self.probe = probe
        self.cluster = ""

    @classmethod
    def for_address(cls, address: str, **kw) -> HeadWatch:
        """A watch of the GCS at host:port (the token comes from RAY_AUTH_TOKEN, as for ray.init)."""
        def probe() -> str:
            from ray._raylet import GcsClient

            return GcsClient(address=address).cluster_id.hex()
        return cls(probe, **kw)

    def start(self) -> None:
        self.cluster = self.probe()
        _HEAD_WATCHES.append(self)
        self._thread = threading.Thread(target=self._watch, name="ray-head-watch", daemon=True)
        self._thread.start()

    def _gone(self, why: str) -> None:
        self._leave(f"{why}; this pod joins the new head")

    def _watch(self) -> None:
        answered = time.monotonic()
        while not self._stop.wait(self.interval):
            try:
                now = self.probe()
            except Exception as exc:  # the head is restarting, or gone
                if time.monotonic() - answered > self.patience:
                    return self._gone(f"the run's Ray head has not answered for {self.patience:.0f} s "
                                      f"({type(exc).__name__})")
                continue
            answered = time.monotonic()
            if now != self.cluster:
                return self._gone(f"the run's Ray head was replaced (cluster {self.cluster[:12]} -> {now[:12]})")
