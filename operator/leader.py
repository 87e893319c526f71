"""Leader election over a coordination.k8s.io Lease, so that the chart can run two operator replicas
and exactly one of them reconciles.

Every candidate reads the Lease each `retry_s`. The holder writes `renewTime` on each read; a
candidate takes the Lease only when the record has not changed for `lease_s` by its own clock (so
clocks need not agree between nodes, only tick at the same rate), or when the holder released it.
Every write is conditional on the resourceVersion it read, so of two candidates racing for an
expired Lease one wins and the other gets a 409. A holder that cannot renew for `renew_deadline_s`
(less than `lease_s`) stops reconciling before anyone else may start: the operator process exits
and its pod restarts as a candidate. That deadline is kept by a watchdog of its own, not by the renewal: a
renewal stuck in an API call (the client waits up to its own timeout, longer than a lease) cannot hold it
off, and once it fires the elector is fenced, so a renewal that returns late writes nothing."""

from __future__ import annotations

import datetime as dt
import http.server
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

from .kube import KubeAPI

log = logging.getLogger(__name__)
LEASE_API = "coordination.k8s.io/v1"


def micro_time(t: float) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_lease_ref(ref: str) -> tuple[str, str]:
    """`namespace/name` (the chart's RLSCALE_OPERATOR_LEASE) as (namespace, name)."""
    ns, sep, name = ref.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise ValueError(f"RLSCALE_OPERATOR_LEASE={ref!r}: expected <namespace>/<name>, e.g. rlscale-system/rlscale")
    return ns, name


class LeaderElector:
    """Acquire, renew and release one Lease for `identity`."""

    def __init__(self, api: KubeAPI, namespace: str, name: str, identity: str, lease_s: float = 15.0,
                 renew_deadline_s: float = 10.0, retry_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        if not retry_s < renew_deadline_s < lease_s:
            raise ValueError(f"leader election needs retry ({retry_s}s) < renew deadline ({renew_deadline_s}s) "
                             f"< lease duration ({lease_s}s)")
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.lease_s, self.renew_deadline_s, self.retry_s = lease_s, renew_deadline_s, retry_s
        self.clock, self.wall = clock, wall
        self._seen: tuple[Any, ...] | None = None  # the holder's record as last read
        self._seen_at = 0.0  # our clock when that record last changed
        self.last_renewed: float | None = None  # our clock at our last successful write as holder
        self.fenced = threading.Event()  # set when the renew deadline passed: never write the Lease again

    # ------------------------------------------------------------ one round

    def try_acquire_or_renew(self) -> bool:
        """One round: True when this candidate holds the Lease after it (renewed or newly taken)."""
        now_wall = self.wall()
        lease = self.api.get(LEASE_API, "Lease", self.namespace, self.name)
        if lease is None:
            if not self.fenced.is_set() and self.api.create_if_absent(self._manifest(now_wall)):
                log.info("leader election: %s created and holds lease %s/%s", self.identity, self.namespace, self.name)
                return self._won()
            return False
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("acquireTime"), spec.get("leaseDurationSeconds"))
        if record != self._seen:
            self._seen, self._seen_at = record, self.clock()
        duration = float(spec.get("leaseDurationSeconds") or self.lease_s)
        if holder and holder != self.identity and self.clock() - self._seen_at < duration:
            return False  # someone else holds it, and has renewed within its lease
        if self.fenced.is_set():
            return False  # this holder gave up at its deadline; a late renewal must not take the Lease back
        patch: dict[str, Any] = {"spec": {"holderIdentity": self.identity, "renewTime": micro_time(now_wall),
                                          "leaseDurationSeconds": int(self.lease_s)}}
        if holder != self.identity:
            patch["spec"]["acquireTime"] = micro_time(now_wall)
            patch["spec"]["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        try:
            self.api.merge_patch(lease, patch)
        except ApiException as exc:
            if exc.status == 409:  # another candidate wrote first: this round is theirs
                return False
            raise
        if holder != self.identity:
            log.info("leader election: %s took lease %s/%s from %s", self.identity, self.namespace, self.name,
                     holder or "nobody (released)")
        return self._won()

    def _won(self) -> bool:
        self.last_renewed = self.clock()
        return True

    def _manifest(self, now_wall: float) -> dict[str, Any]:
        return {"apiVersion": LEASE_API, "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.lease_s),
                         "acquireTime": micro_time(now_wall), "renewTime": micro_time(now_wall),
                         "leaseTransitions": 0}}

    # ------------------------------------------------------------ loops

    def wait_until_leader(self, stop: threading.Event) -> bool:
        """Try every `retry_s` until this candidate holds the Lease (True) or `stop` is set (False)."""
        while not stop.is_set():
            try:
                if self.try_acquire_or_renew():
                    return True
            except Exception as exc:  # noqa: BLE001 - the API server may be away; keep trying
                log.warning("leader election: %s: %s", self.identity, exc)
            stop.wait(self.retry_s)
        return False

    def renew_once(self) -> bool:
        """One renewal as holder: False once no renewal has succeeded for `renew_deadline_s`."""
        try:
            if self.try_acquire_or_renew():
                return True
        except Exception as exc:  # noqa: BLE001 - a failed renewal is retried until the deadline
            log.warning("leader election: renewal failed: %s", exc)
        return self.last_renewed is not None and self.clock() - self.last_renewed < self.renew_deadline_s

    def hold(self, on_lost: Callable[[], None], stop: threading.Event) -> threading.Thread:
        """Renew in a daemon thread until `stop`; a second one, the watchdog, fences the elector and calls
        `on_lost` once when the last renewal is `renew_deadline_s` old or the Lease was taken, whether or
        not a renewal is still waiting on the API server. Returns the watchdog."""
        taken = threading.Event()

        def renew() -> None:
            while not stop.wait(self.retry_s) and not self.fenced.is_set():
                if not self.renew_once():
                    taken.set()
                    return

        def watchdog() -> None:
            # Looks more often than the renewal, so the deadline is kept within a fraction of retry_s.
            while not stop.wait(self.retry_s / 4):
                late = self.last_renewed is None or self.clock() - self.last_renewed >= self.renew_deadline_s
                if late or taken.is_set():
                    self.fenced.set()
                    log.error("leader election: %s lost lease %s/%s (%s); stopping at once", self.identity,
                              self.namespace, self.name, "taken" if taken.is_set() else "renew deadline passed")
                    on_lost()
                    return

        threading.Thread(target=renew, name="lease-renewal", daemon=True).start()
        t = threading.Thread(target=watchdog, name="lease-watchdog", daemon=True)
        t.start()
        return t

    def release(self) -> None:
        """Give the Lease up at a clean exit, so a standby takes it at its next round, not a lease later."""
        try:
            lease = self.api.get(LEASE_API, "Lease", self.namespace, self.name)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                self.api.merge_patch(lease, {"spec": {"holderIdentity": None, "leaseDurationSeconds": 1,
                                                      "renewTime": micro_time(self.wall())}})
                log.info("leader election: %s released lease %s/%s", self.identity, self.namespace, self.name)
        except Exception as exc:  # noqa: BLE001 - the standby takes over after the lease instead
            log.warning("leader election: release failed (a standby waits out the lease): %s", exc)


class StandbyHealth:
    """/healthz while a replica stands by (kopf serves it once this one leads), so the chart's
    liveness probe does not restart a healthy standby."""

    def __init__(self, url: str):
        rest = url.split("://", 1)[-1]
        hostport = rest.split("/", 1)[0]
        host, _, port = hostport.rpartition(":")

        class Ok(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"standby\n")

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host or "0.0.0.0", int(port)), Ok)
        # Polled every 50 ms rather than http.server's 0.5 s, so close() returns at once.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="standby-health", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
