"""A pool of tool worker processes (rlscale.trainer.tools.worker): each call runs in one, under the worker's
limits and the pool's wall-clock timeout; a worker that times out, dies or breaks the protocol is killed
and replaced, and the call that did it gets an error observation. Nothing a tool does ends the run.

Workers start with `python -m` (not fork: the driver holds threads and, on GPUs, CUDA), lazily, and are
reused call after call; each call gets fresh globals (the Python tool keeps no state between calls).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlscale.trainer.tools.worker import CONFIG_ENV

log = logging.getLogger("rlscale.tools")
STARTUP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ToolDef:
    """One tool as the spec names it: a builtin (calculator, python) or a plug-in module:function."""

    name: str
    builtin: str | None = None
    function: str | None = None
    timeout_s: float = 5.0
    max_output_chars: int = 2048
    description: str = ""

    def worker_config(self) -> dict[str, Any]:
        return {"builtin": self.builtin} if self.builtin else {"function": self.function}


def tool_defs(spec: Any) -> list[ToolDef]:
    """spec.task.tools as the pools take them."""
    return [ToolDef(t.name, builtin=t.builtin, function=t.function, timeout_s=t.timeout_seconds,
                    max_output_chars=t.max_output_chars) for t in spec.task.tools or []]


@dataclass
class ToolResult:
    """One call's observation and what happened: `ok`, `error` (the tool raised; its message is the output),
    `timeout` or `died` (the worker was killed or ended; replaced), `refused` (never made: a malformed call)."""

    output: str
    kind: str = "ok"
    seconds: float = 0.0
    truncated: bool = False

    @property
    def failed(self) -> bool:
        return self.kind != "ok"


@dataclass
class PoolStats:
    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    deaths: int = 0
    replaced: int = 0
    seconds: float = 0.0
    isolation: set = field(default_factory=set)


class _Worker:
    def __init__(self, config: dict[str, Any]):
        env = {**os.environ, CONFIG_ENV: json.dumps(config), "PYTHONDONTWRITEBYTECODE": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "rlscale.trainer.tools.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, start_new_session=True)
        self.cpu = 0.0
        hello = self.read(STARTUP_TIMEOUT_S)
        if hello and hello.get("error"):  # a plug-in tool that does not import: no restart helps
            self.kill()
            raise ImportError(f"spec.task.tools: a tool worker could not load the tools: {hello['error']}; run from "
                              "the directory that holds the module or put it on PYTHONPATH")
        if not hello or not hello.get("ready"):  # None (no answer in time) or {} (it ended)
            self.kill()
            why = f"exit status {self.proc.poll()}"
            raise RuntimeError(f"spec.task.tools: a tool worker did not start ({why}); check the tools' "
                               "module:function names import on the driver's node")
        self.network = hello["network"]

    def read(self, timeout: float) -> dict | None:
        """The next answer line; None at the timeout, {} when the worker ended."""
        out = self.proc.stdout
        ready, _, _ = select.select([out], [], [], max(0.0, timeout))
        if not ready:
            return None
        line = out.readline()
        return json.loads(line) if line else {}

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            f.close()


class ToolCalls:
    """What a pool of tools shares, wherever its calls run: `tools` by name, `call` (one call, never raising
    for a tool's fault), `_executor` (the threads `call_many` runs calls on) and `stats` under `_lock`."""

    tools: dict[str, ToolDef]
    stats: PoolStats
    _executor: ThreadPoolExecutor
    _lock: threading.Lock

    def call(self, name: str, arguments: dict) -> ToolResult:
        raise NotImplementedError

    def call_many(self, calls: Sequence[tuple[str, dict]]) -> list[ToolResult]:
        """Each (tool name, arguments) called on the pool's threads; results in order."""
        return list(self._executor.map(lambda c: self.call(*c), calls))

    def count(self, result: ToolResult) -> ToolResult:
        """`result` counted in the pool's stats (calls from several threads); returned."""
        with self._lock:
            s = self.stats
            s.calls += 1
            s.seconds += result.seconds
            s.errors += result.kind == "error"
            s.timeouts += result.kind == "timeout"
            s.deaths += result.kind == "died"
        return result

    def unknown(self, name: str) -> ToolResult | None:
        """The refusal of a call to a tool the spec does not name (None for one it does)."""
        if name in self.tools:
            return None
        return ToolResult(f"error: there is no tool named {name!r}; the tools are {', '.join(self.tools)}",
                          "refused")


class ToolPool(ToolCalls):
    """Calls tools in `workers` worker processes, in parallel; `call_many` never raises for a tool's fault."""

    def __init__(self, tools: Sequence[ToolDef], workers: int = 2, memory_mb: int = 1024,
                 lifetime_cpu_s: int = 600):
        self.tools = {t.name: t for t in tools}
        self.config = {"tools": {t.name: t.worker_config() for t in tools}, "memory_mb": memory_mb,
                       "lifetime_cpu_s": lifetime_cpu_s}
        self.lifetime_cpu_s = lifetime_cpu_s
        self.size = max(1, workers)
        self.idle: queue.Queue[_Worker | None] = queue.Queue()
        for _ in range(self.size):
            self.idle.put(None)  # started on first use
        self.stats = PoolStats()
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(self.size, thread_name_prefix="tool")

    def call(self, name: str, arguments: dict) -> ToolResult:
        refused = self.unknown(name)
        if refused is not None:
            return refused
        tool = self.tools[name]
        worker = self.idle.get()
        try:
            if worker is None:
                worker = _Worker(self.config)
                with self._lock:
                    self.stats.isolation.add(worker.network)
            result, worker = self._call(worker, tool, arguments)
        finally:
            self.idle.put(worker)
        return self.count(result)

    def _call(self, worker: _Worker, tool: ToolDef, arguments: dict) -> tuple[ToolResult, _Worker | None]:
        req = {"tool": tool.name, "arguments": arguments, "cpu_seconds": tool.timeout_s,
               "max_output_chars": tool.max_output_chars}
        t0 = time.perf_counter()
        try:
            worker.proc.stdin.write((json.dumps(req) + "\n").encode())
            worker.proc.stdin.flush()
            answer = worker.read(tool.timeout_s)
        except (OSError, ValueError):  # a broken pipe: the worker ended; an unreadable answer
            answer = {}
        seconds = time.perf_counter() - t0
        if answer:
            worker.cpu = float(answer.get("cpu", 0.0))
            kind = "error" if answer.get("error") else "ok"
            result = ToolResult(str(answer.get("output", "")), kind, seconds, bool(answer.get("truncated")))
            if worker.cpu > self.lifetime_cpu_s / 2:  # retired before its hard CPU limit could end a call
                worker.kill()
                worker = None
            return result, worker
        try:  # at the end of its output (answer {}) the worker is ending: its status says why
            status = worker.proc.wait(timeout=2.0) if answer is not None else None
        except subprocess.TimeoutExpired:
            status = None
        worker.kill()
        with self._lock:
            self.stats.replaced += 1
        if status is None:
            msg = f"error: the {tool.name} call took longer than {tool.timeout_s:g} s and was stopped"
            return ToolResult(msg, "timeout", seconds), None
        why = f"signal {signal.Signals(-status).name}" if status < 0 else f"exit status {status}"
        if status == -signal.SIGXCPU:
            why += f" (CPU time over {tool.timeout_s:g} s)"
        elif status in (-signal.SIGKILL, -signal.SIGSEGV, -signal.SIGABRT):
            why += " (out of memory, or a crash)"
        return ToolResult(f"error: the {tool.name} call ended its process ({why})", "died", seconds), None

    def take_stats(self) -> PoolStats:
        """The counts since the last take (one step's), and start again."""
        with self._lock:
            s, self.stats = self.stats, PoolStats(isolation=set(self.stats.isolation))
        return s

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        while not self.idle.empty():
            w = self.idle.get_nowait()
            if w is not None:
                w.kill()
