"""Entry point: `rlscale operator` / `python -m rlscale.operator` run kopf with our handlers."""

from __future__ import annotations

import logging
import os
import sys
import threading

import kopf

from rlscale.metrics_names import OPERATOR_METRICS_PORT

from . import metrics
from .handlers import Handlers
from .kube import Kube
from .leader import LeaderElector, StandbyHealth, parse_lease_ref
from .reconcile import Controller
from .settings import OperatorSettings

log = logging.getLogger(__name__)


def run(namespaces: list[str] | None = None, metrics_port: int = OPERATOR_METRICS_PORT,
        settings: OperatorSettings | None = None) -> int:
    """Serve /metrics, then reconcile RLRuns in the given namespaces (all when empty) until stopped."""
    if settings is None:
        try:
            settings = OperatorSettings.from_env()
        except ValueError as exc:  # a chart value the operator cannot take (a placement profile): say which
            print(f"rlscale operator: {exc}", file=sys.stderr)
            return 2
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kopf").setLevel(settings.kopf_log_level)
    # One access line per liveness probe (every 20 s in the chart) buries the operator's own.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    metrics.serve(metrics_port, settings.bind)
    kube = Kube(settings.kubeconfig)
    lost = threading.Event()  # set when this replica loses the Lease
    done = threading.Event()  # kopf has returned: renew no more
    elector = _elect(kube, settings, lost, done)
    if elector is False:
        return 0  # stopped while standing by
    registry = kopf.OperatorRegistry()
    Handlers(Controller(kube, settings), settings).register(registry)
    try:
        kopf.run(
            registry=registry,
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces or (),
            liveness_endpoint=settings.health or None,
        )
    finally:
        done.set()
        metrics.LEADER.set(0)
    if lost.is_set():
        # Lost, not stopped: exit non-zero so the pod restarts as a standby with a clean slate.
        return 1
    if elector is not None:
        elector.release()
    return 0


def _elect(kube: Kube, settings: OperatorSettings, lost: threading.Event,
           done: threading.Event) -> LeaderElector | None | bool:
    """Block until this replica leads (its renewal thread then sets `lost` if the Lease slips);
    None when no Lease is configured, False when interrupted while standing by."""
    if not settings.lease:
        metrics.LEADER.set(1)
        return None
    ns, name = parse_lease_ref(settings.lease)
    lease_s = settings.lease_seconds
    elector = LeaderElector(kube, ns, name, settings.identity, lease_s=lease_s,
                            renew_deadline_s=lease_s * 2 / 3, retry_s=lease_s / 7.5)
    health = StandbyHealth(settings.health) if settings.health else None
    log.info("leader election: %s standing by for lease %s", settings.identity, settings.lease)
    stop = threading.Event()
    try:
        won = elector.wait_until_leader(stop)
    except KeyboardInterrupt:
        won = False
    finally:
        if health is not None:
            health.close()
    if not won:
        return False
    metrics.LEADER.set(1)
    log.info("leader election: %s leads; reconciling", settings.identity)
    def step_down() -> None:
        # Exit at once, as controller-runtime does: a graceful stop would let kopf finish the passes in
        # flight, and their writes would land after a standby may have taken over. The pod restarts as a
        # standby with a clean slate.
        lost.set()
        metrics.LEADER.set(0)
        logging.shutdown()
        os._exit(1)
    elector.hold(step_down, done)
    return elector
