"""Reward calls in worker processes, each call killed at task.rewardTimeout.

A thread cannot stop a call stuck in C (a regular expression backtracking holds the GIL, so not even
the driver's timeout thread runs): the worker process running it is killed and replaced, and the
call scores task.rewardTimeoutScore or stops the run. Workers are started once per run (spawn: the
driver holds threads, CUDA and NCCL) and rebuild the reward from its expression as the driver did
(trainer.rewards' resolve_reward: plug-ins found through the same sys.path, working directory and
RLSCALE_PLUGINS). Each worker takes a chunk of calls at a time and answers each call on its own, so
a call's clock starts when the one before it answered.
"""

from __future__ import annotations

import atexit
import logging
import math
import multiprocessing as mp
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 300.0  # a worker imports the reward (math-verify: sympy) before its first call
MAX_CHUNK = 32
OK, ERROR, BAD, TIMEOUT, DIED = "ok", "error", "bad", "timeout", "died"
KILLED = "killed"  # the worker died of a signal it did not send itself (the OOM killer's SIGKILL)

Row = tuple[str, str, str, Mapping, bool]  # prompt, completion, answer, extra, finished


@dataclass
class Outcome:
    """One call's result: `ok` with the terms' values, or `error` (the reward raised), `bad` (it returned
    something that is no float), `timeout` (killed at the timeout) or `died` (its worker ended)."""

    kind: str
    values: list[float] | None = None
    message: str = ""


def default_workers() -> int:
    """task.rewardWorkers 0: one per core this process may use (its CPU set and cgroup quota), at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="utf-8") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def _serve(conn: Connection, build: Callable[..., Any], call: Callable[[Any, Row], tuple[str, Any]],
           args: tuple) -> None:
    """A worker: build the terms (`build(*args)`), then answer (index, kind, values or message) for every
    call sent, `call(terms, row)` giving (kind, values or message)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the driver's loop; it ends the workers
    try:
        terms = build(*args)
    except BaseException as exc:  # noqa: B036 - told to the parent, which names it
        conn.send(("fatal", f"{exc.__class__.__name__}: {exc}"))
        return
    conn.send(("ready",))
    while True:
        try:
            chunk = conn.recv()
        except EOFError:  # the driver is gone
            return
        if chunk is None:
            return
        for i, row in chunk:
            conn.send((i, *call(terms, row)))


class _Worker:
    def __init__(self, ctx: Any, args: tuple):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, *args), daemon=True, name="rlscale-reward")
        self.proc.start()
        child.close()
        self.ready = False
        self.calls: deque[int] = deque()  # sent, not yet answered; the first one runs
        self.since = 0.0  # when the running call started

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)
        self.conn.close()


class RewardPool:
    """Worker processes that build their terms with `build(*args)` and score a row with `call(terms, row)`
    (trainer.rewards gives both); `run` scores rows in order."""

    def __init__(self, build: Callable[..., Any], call: Callable[[Any, Row], tuple[str, Any]], args: tuple,
                 workers: int, timeout_s: float):
        self._ctx = mp.get_context("spawn")
        self._args = (build, call, args)  # module-level functions: a spawned worker imports them
        self.timeout_s = float(timeout_s)
        self.size = max(1, int(workers))
        self.replaced = 0  # workers killed at a timeout (or that died) and started anew
        self.workers = [_Worker(self._ctx, self._args) for _ in range(self.size)]
        self._closed = False
        atexit.register(self.close)

    def close(self) -> None:
        """End every worker (at the run's end; idempotent)."""
        if self._closed:
            return
        self._closed = True
        for w in self.workers:
            try:
                w.conn.send(None)
            except OSError:
                pass
        for w in self.workers:
            w.proc.join(2)
            if w.proc.is_alive():
                w.kill()
        self.workers = []
        atexit.unregister(self.close)

    def run(self, rows: Sequence[Row], stop_on_timeout: bool = True) -> list[Outcome | None]:
        """Every row's outcome, in order. After an error, a bad value, a worker that died, or (with
        stop_on_timeout) a timeout, the rows not yet scored stay None: the caller stops the run."""
        if self._closed:
            raise RuntimeError("the reward pool was closed")
        out: list[Outcome | None] = [None] * len(rows)
        pending = deque(range(len(rows)))
        chunk = max(1, min(MAX_CHUNK, math.ceil(len(rows) / (4 * self.size))))
        left, started = len(rows), time.monotonic()
        while left:
            now = time.monotonic()
            for w in self.workers:
                if w.ready and not w.calls and pending:
                    calls = [pending.popleft() for _ in range(min(chunk, len(pending)))]
                    w.conn.send([(i, rows[i]) for i in calls])
                    w.calls.extend(calls)
                    w.since = now
            busy = [w for w in self.workers if w.calls]
            if not busy and not any(w.ready for w in self.workers) and now - started > STARTUP_TIMEOUT_S:
                raise RuntimeError(f"no reward worker started within {STARTUP_TIMEOUT_S:g} s")
            wait_s = min([w.since + self.timeout_s - now for w in busy] + [1.0])
            for conn in wait([w.conn for w in self.workers], timeout=max(0.0, wait_s)):
                left -= self._receive(next(w for w in self.workers if w.conn is conn), out, pending)
            left -= self._kill_late(out, pending)
            if any(o is not None and (o.kind not in (OK, TIMEOUT) or stop_on_timeout and o.kind == TIMEOUT)
                   for o in out):
                self._reset_busy()
                break
        return out

    def _receive(self, w: _Worker, out: list[Outcome | None], pending: deque[int]) -> int:
        """Take what a worker sent; returns how many calls it finished."""
        done = 0
        try:
            while w.conn.poll():
                msg = w.conn.recv()
                if msg[0] == "ready":
                    w.ready = True
                elif msg[0] == "fatal":
                    raise RuntimeError(f"a reward worker could not build the reward: {msg[1]}")
                else:
                    i, kind, payload = msg
                    out[i] = Outcome(kind, payload, "") if kind == OK else Outcome(kind, None, payload)
                    w.calls.popleft()
                    w.since = time.monotonic()
                    done += 1
        except (EOFError, OSError):  # the process ended under its call (os._exit, a crash)
            w.proc.join(1)
            code = w.proc.exitcode
            if not w.ready:
                raise RuntimeError(f"a reward worker ended while starting (exit code {code})") from None
            if w.calls:
                kind = KILLED if code is not None and code < 0 else DIED
                out[w.calls.popleft()] = Outcome(kind, None, f"its worker process ended (exit code {code})")
                done += 1
            self._replace(w, pending)
        return done

    def _kill_late(self, out: list[Outcome | None], pending: deque[int]) -> int:
        """Kill the workers whose running call is past the timeout; that call timed out."""
        late = [w for w in self.workers if w.calls and time.monotonic() - w.since > self.timeout_s]
        for w in late:
            out[w.calls.popleft()] = Outcome(TIMEOUT)
            self._replace(w, pending)
        return len(late)

    def _replace(self, w: _Worker, pending: deque[int]) -> None:
        """A new worker in w's place; w's unanswered calls go back to the front of the queue."""
        w.kill()
        pending.extendleft(reversed(w.calls))
        self.workers[self.workers.index(w)] = _Worker(self._ctx, self._args)
        self.replaced += 1

    def _reset_busy(self) -> None:
        """After a failure the busy workers' answers would be stale: replace those workers."""
        for w in [w for w in self.workers if w.calls]:
            w.calls.clear()
            self._replace(w, deque())
