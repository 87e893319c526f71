"""Tool workers in pods of their own (spec.task.toolSandbox.isolation: pod): the tool pod's HTTP server, which
runs every call in its own sandboxed worker pool (sandbox.ToolPool: the per-call wall-clock timeout, the output
limit, kill and replace), and the driver's client, which stands where the local pool stands (ToolEnvironment
takes either) and turns whatever goes wrong with a tool pod (no answer in time, a refused connection, a
broken or oversized answer) into that call's error observation.

The limits are the spec's on both sides: the server enforces them as the local pool does, and the client cuts
the output to `maxOutputChars` again and waits at most `timeoutSeconds` plus ANSWER_SLACK_S, so a tool pod that
hangs, dies or misbehaves costs the call, never the run.

Protocol: POST /call {"tool": name, "arguments": {...}} -> {"output", "kind", "seconds", "truncated"};
GET /ready -> {"ready": true, "network": how the workers cut the network} once a worker has started.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rlscale.trainer.tools.sandbox import PoolStats, ToolCalls, ToolDef, ToolPool, ToolResult, tool_defs

log = logging.getLogger("rlscale.tools")
ANSWER_SLACK_S = 5.0  # past the tool's own timeout: the server's kill and replace, and the round trip
MAX_REQUEST_BYTES = 1 << 20  # a call's arguments: the model's text, far less
READY_TIMEOUT_S = 600.0  # how long the driver waits for the tool pods at start (image pull, scheduling)


class _Handler(BaseHTTPRequestHandler):
    server: ToolServer  # type: ignore[assignment]

    def log_message(self, fmt: str, *args: Any) -> None:  # the driver's records count the calls
        return

    def _answer(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        if self.path == "/ready":
            self._answer(200, {"ready": True, "network": sorted(self.server.isolation)})
        else:
            self._answer(404, {"error": "GET /ready or POST /call"})

    def do_POST(self) -> None:  # noqa: N802
        size = int(self.headers.get("Content-Length") or 0)
        if self.path != "/call":
            self._answer(404, {"error": "POST /call"})
            return
        if size > MAX_REQUEST_BYTES:
            self._answer(413, {"error": f"a call's request is at most {MAX_REQUEST_BYTES} bytes"})
            return
        try:
            req = json.loads(self.rfile.read(size) or b"{}")
            name, arguments = str(req["tool"]), req.get("arguments") or {}
            if not isinstance(arguments, dict):
                raise ValueError("arguments is not an object")
        except (ValueError, KeyError, TypeError) as exc:
            self._answer(400, {"error": f"a call is {{\"tool\": name, \"arguments\": {{...}}}}: {exc}"})
            return
        r = self.server.pool.call(name, arguments)
        self._answer(200, {"output": r.output, "kind": r.kind, "seconds": r.seconds, "truncated": r.truncated})


class ToolServer(ThreadingHTTPServer):
    """The tool pod's server: each request's call runs in `pool` (its size bounds the calls at once)."""

    daemon_threads = True

    def __init__(self, pool: ToolPool, host: str = "0.0.0.0", port: int = 0):
        self.pool = pool
        first = pool.tools[next(iter(pool.tools))]
        pool.call(first.name, {})  # starts a worker: the tools import, or the pod fails naming them
        self.isolation = set(pool.take_stats().isolation)
        super().__init__((host, port), _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


def serve_spec(spec: Any, port: int) -> int:
    """`rlscale tool-server`: the spec's tools behind ToolServer on `port` until the pod is stopped."""
    from rlscale.spec.tools import POD_TOOL_WORKERS

    t = spec.task
    pool = ToolPool(tool_defs(spec), workers=t.tool_workers or POD_TOOL_WORKERS, memory_mb=t.tool_memory_mb)
    server = ToolServer(pool, port=port)
    log.info("tool server on :%d: tools %s in %d workers (network cut by %s)", server.port, ", ".join(pool.tools),
             pool.size, " and ".join(sorted(server.isolation)) or "?")
    try:
        server.serve_forever()
    finally:
        pool.close()
    return 0


class RemoteToolPool(ToolCalls):
    """The driver's side: ToolPool's interface (tools, size, call, call_many, take_stats, close) over HTTP to the
    tool pods' Service at `url`. Never raises for a tool pod's fault: the call gets an error observation."""

    def __init__(self, tools: Sequence[ToolDef], url: str, parallel: int = 16, slack_s: float = ANSWER_SLACK_S):
        self.tools = {t.name: t for t in tools}
        self.slack_s = slack_s
        self.url = url.rstrip("/")
        self.size = max(1, parallel)
        self.stats = PoolStats()
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(self.size, thread_name_prefix="remote-tool")

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> set[str]:
        """Wait for a tool pod to answer /ready; returns how its workers cut the network. Raises naming the
        spec field when none answers in time (the run cannot call its tools)."""
        deadline, last = time.monotonic() + timeout, ""
        while True:
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=10) as r:
                    how = set(json.loads(r.read(4096)).get("network") or [])
                with self._lock:
                    self.stats.isolation |= how
                return how
            except (OSError, ValueError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise RuntimeError(f"spec.task.toolSandbox: no tool pod answered at {self.url} within {timeout:.0f} s "
                                   f"({last}); see the tool pods' events and logs (kubectl describe pods -l "
                                   "rlscale.dev/role=tools)")
            time.sleep(0.25)  # a tool pod answers within seconds of starting; the run waits for no more than that

    def call(self, name: str, arguments: dict) -> ToolResult:
        refused = self.unknown(name)
        if refused is not None:
            return refused
        tool = self.tools[name]
        t0 = time.perf_counter()
        result = self._post(tool, arguments)
        result.seconds = result.seconds or (time.perf_counter() - t0)
        return self.count(result)

    def _post(self, tool: ToolDef, arguments: dict) -> ToolResult:
        body = json.dumps({"tool": tool.name, "arguments": arguments}).encode()
        req = urllib.request.Request(self.url + "/call", body, {"Content-Type": "application/json"})
        wait = tool.timeout_s + self.slack_s
        # The server sends at most the output limit; a JSON string escapes a character to 6 bytes at most.
        cap = 6 * tool.max_output_chars + 4096
        try:
            with urllib.request.urlopen(req, timeout=wait) as r:
                raw = r.read(cap + 1)
        except (OSError, ValueError) as exc:  # refused, reset, timed out, an HTTP error status
            why = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            if isinstance(why, TimeoutError):  # in the answer (TimeoutError) or the connect (URLError's reason)
                return ToolResult(f"error: the {tool.name} call got no answer from the tool pods within {wait:g} s",
                                  "timeout", wait)
            return ToolResult(f"error: the {tool.name} call failed at the tool pods ({why})", "died")
        try:
            if len(raw) > cap:
                raise ValueError(f"an answer past {cap} bytes")
            got = json.loads(raw)
            output, kind = str(got["output"]), str(got.get("kind") or "ok")
        except (ValueError, KeyError, TypeError) as exc:
            return ToolResult(f"error: the tool pods answered the {tool.name} call with no result ({exc})", "died")
        cut = len(output) > tool.max_output_chars
        if cut:  # the server cuts it already; a tool pod is not trusted to
            output = output[:tool.max_output_chars] + f"\n[{len(output) - tool.max_output_chars} more characters cut]"
        return ToolResult(output, kind if kind in ("ok", "error", "timeout", "died", "refused") else "error",
                          float(got.get("seconds") or 0.0), cut or bool(got.get("truncated")))

    def take_stats(self) -> PoolStats:
        with self._lock:
            s, self.stats = self.stats, PoolStats(isolation=set(self.stats.isolation))
        return s

    def close(self) -> None:
        self._executor.shutdown(wait=True)
