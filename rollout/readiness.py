"""The HTTP server a pod's process answers its kubelet on: /metrics from a Prometheus registry and
/ready, 200 while the process's readiness check holds and 503 otherwise.

The operator gives the rollout and learner pods a readiness probe on GET /ready at their metrics
port (operator/availability.py), so a pod is Ready only once its work can start: a rollout pod's
Serve replica has its engine loaded and is registered, a learner rank has joined the training
process group. The server lives in the process whose state it reports: a process that exits (a
gang restart, a replica lost) takes /ready with it, and its restarted container is not Ready until
the check holds again.

Used by both roles (the learner imports it too): it needs only the standard library and
prometheus_client, no torch, Ray or vLLM.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

log = logging.getLogger(__name__)

READY_PATH = "/ready"


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a probe in flight does not hold the process open


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # one probe every few seconds would fill the role's log


def _never() -> bool:
    return False


class ProbeServer:
    """Serves /ready from `check` and every other path as Prometheus metrics of `registry`
    (prometheus_client's own WSGI app: content negotiation and gzip as start_http_server has them).
    Both can be swapped while it runs: a process starts the server first, answering 503, and names
    its check and its metrics once it has them."""

    def __init__(self, port: int, addr: str = "0.0.0.0", registry: CollectorRegistry | None = None,
                 check: Callable[[], bool] | None = None):
        self._metrics = make_wsgi_app(registry if registry is not None else CollectorRegistry())
        self._check: Callable[[], bool] = check or _never
        self._httpd = make_server(addr, port, self._app, _Server, handler_class=_QuietHandler)
        # Polled every 50 ms rather than http.server's 0.5 s, so close() (a pod's stop) returns at once.
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="probe-server", daemon=True)
        self._thread.start()

    @property
    def server_port(self) -> int:
        return int(self._httpd.server_port)

    def serve_registry(self, registry: CollectorRegistry) -> None:
        """Serve this registry's metrics from now on."""
        self._metrics = make_wsgi_app(registry)

    def ready_when(self, check: Callable[[], bool]) -> None:
        """/ready answers 200 while `check()` is true."""
        self._check = check

    def ready(self) -> bool:
        try:
            return bool(self._check())
        except Exception as exc:  # a check that fails says "not ready", it does not break the server
            log.debug("readiness check failed: %s", exc)
            return False

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == READY_PATH:
            ok = self.ready()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ready\n" if ok else b"not ready\n"]
        return self._metrics(environ, start_response)

    def shutdown(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
