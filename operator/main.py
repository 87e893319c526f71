"""Entry point: `rlscale operator` / `python -m rlscale.operator` run kopf with our handlers."""

from __future__ import annotations

import logging

import kopf

from rlscale.metrics_names import OPERATOR_METRICS_PORT

from . import metrics
from .handlers import Handlers
from .kube import Kube
from .reconcile import Controller
from .settings import OperatorSettings


def run(namespaces: list[str] | None = None, metrics_port: int = OPERATOR_METRICS_PORT,
        settings: OperatorSettings | None = None) -> int:
    """Serve /metrics, then reconcile RLRuns in the given namespaces (all when empty) until stopped."""
    settings = settings or OperatorSettings.from_env()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kopf").setLevel(settings.kopf_log_level)
    # One access line per liveness probe (every 20 s in the chart) buries the operator's own.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    metrics.serve(metrics_port, settings.bind)
    registry = kopf.OperatorRegistry()
    Handlers(Controller(Kube(settings.kubeconfig), settings), settings).register(registry)
    kopf.run(
        registry=registry,
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces or (),
        liveness_endpoint=settings.health or None,
    )
    return 0
