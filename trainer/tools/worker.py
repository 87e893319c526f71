"""The process a tool call runs in: `python -m rlscale.trainer.tools.worker`, started and fed by sandbox.ToolPool.

At start, before any call, it drops what a tool must not have: its own network namespace (no interface
but a downed loopback: unshare(CLONE_NEWUSER | CLONE_NEWNET), which needs no privilege where user
namespaces are enabled), an address-space limit, a file-size limit of 0 (no regular file can be
written), no new processes or threads (RLIMIT_NPROC 0 once it runs as the namespace's unmapped user),
and a Python audit hook that refuses sockets, subprocesses, writes, deletes and ctypes whatever
happened to the namespace. Before each call the CPU-time limit is set to the time used plus the
call's; the pool's wall-clock timeout kills the process whatever it does. The protocol is one JSON
line per request on stdin and one per answer on a duplicate of fd 1; fd 1 itself goes to /dev/null
and the tool's prints go to a buffer that keeps the first `max_output_chars`.
"""

from __future__ import annotations

import ast
import io
import json
import os
import resource
import sys
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

CONFIG_ENV = "RLSCALE_TOOL_WORKER"
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
_BLOCKED_PREFIXES = ("socket.", "subprocess.", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.system",
                     "os.kill", "os.killpg", "pty.", "ctypes.", "os.remove", "os.rename", "os.rmdir", "os.mkdir",
                     "os.chmod", "os.chown", "os.link", "os.symlink", "os.truncate", "os.utime", "shutil.",
                     "os.setxattr", "os.removexattr", "webbrowser.", "urllib.Request", "http.client.")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class CappedText(io.TextIOBase):
    """A text stream that keeps the first `limit` characters and counts the rest."""

    def __init__(self, limit: int):
        self.limit, self.parts, self.kept, self.dropped = limit, [], 0, 0

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        s = str(s)
        room = max(0, self.limit - self.kept)
        if room:
            self.parts.append(s[:room])
            self.kept += min(room, len(s))
        self.dropped += max(0, len(s) - room)
        return len(s)

    def text(self) -> str:
        out = "".join(self.parts)
        return out + (f"\n[{self.dropped} more characters cut]" if self.dropped else "")


def _audit(event: str, args: tuple) -> None:
    if event.startswith(_BLOCKED_PREFIXES):
        raise PermissionError(f"{event} is not allowed in a tool")
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS)
        if writes:
            raise PermissionError(f"writing {path!r} is not allowed in a tool")


def drop_network() -> bool:
    """A network namespace of the process's own (nothing but a downed loopback); False where the kernel
    refuses one (user namespaces disabled), and then only the audit hook keeps sockets out."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0
    except (OSError, AttributeError):
        return False


def isolate(memory_mb: int, lifetime_cpu_s: int) -> str:
    """Drop the network, cap memory, CPU over the worker's life and file writes; returns how the network was
    cut. The pool retires a worker past half its lifetime CPU, so the hard limit ends only a runaway."""
    how = "netns" if drop_network() else "audit-hook"
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (lifetime_cpu_s, lifetime_cpu_s))
    if how == "netns":  # unprivileged now: the kernel holds the limit (root outside a namespace would ignore it)
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    sys.dont_write_bytecode = True
    sys.addaudithook(_audit)
    return how


def run_python(code: str) -> Any:
    """Run `code` in fresh globals; the value of a last expression is printed, as in a notebook."""
    tree = ast.parse(code, mode="exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    scope: dict[str, Any] = {"__name__": "__tool__"}
    exec(compile(tree, "<tool>", "exec"), scope)  # noqa: S102  (the tool's purpose; the process is the sandbox)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<tool>", "eval"), scope)  # noqa: S307
        if value is not None:
            print(repr(value))
    return None


def _load(tools: dict[str, dict]) -> dict[str, Any]:
    """Each tool's function: the builtins, or a plug-in module:function imported before isolation."""
    from rlscale.trainer.tools.calculator import calculate

    fns: dict[str, Any] = {}
    for name, t in tools.items():
        if t.get("builtin") == "calculator":
            fns[name] = lambda expression="", **_: calculate(expression)
        elif t.get("builtin") == "python":
            fns[name] = lambda code="", **_: run_python(code)
        else:
            from rlscale.trainer.tools.plugins import import_object

            fns[name] = import_object(t["function"], f"spec.task.tools[{name}].function")
    return fns


def call(fn: Any, arguments: dict, limit: int) -> dict[str, Any]:
    out = CappedText(limit)
    error = False
    try:
        with redirect_stdout(out), redirect_stderr(out):
            value = fn(**arguments)
        if value is not None:
            out.write(value if isinstance(value, str) else json.dumps(value, default=str))
    except BaseException as exc:  # the tool's failure is the model's observation, whatever it was
        error = True
        frames = traceback.extract_tb(exc.__traceback__)
        where = next((f"line {f.lineno}: " for f in reversed(frames) if f.filename == "<tool>"), "")
        out.write(f"{'' if not out.kept else chr(10)}error: {where}{type(exc).__name__}: {exc}")
    return {"output": out.text(), "error": error, "truncated": out.dropped > 0}


def main() -> int:
    cfg = json.loads(os.environ[CONFIG_ENV])
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb"))
    try:
        fns = _load(cfg["tools"])
    except Exception as exc:
        proto.write(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"}) + "\n")
        return 1
    how = isolate(int(cfg.get("memory_mb", 1024)), int(cfg.get("lifetime_cpu_s", 600)))
    sys.stdin = io.StringIO("")
    proto.write(json.dumps({"ready": True, "network": how}) + "\n")
    requests = os.fdopen(0, "r")
    for line in requests:
        req = json.loads(line)
        used = resource.getrusage(resource.RUSAGE_SELF)
        cpu = used.ru_utime + used.ru_stime
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        resource.setrlimit(resource.RLIMIT_CPU, (min(hard, int(cpu + float(req.get("cpu_seconds", 10)) + 1)), hard))
        t0 = time.perf_counter()
        res = call(fns[req["tool"]], req.get("arguments") or {}, int(req.get("max_output_chars", 4096)))
        res["seconds"], res["cpu"] = time.perf_counter() - t0, cpu
        proto.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
