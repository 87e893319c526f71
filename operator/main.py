"""Entry point: `rlscale operator` / `python -m rlscale.operator` run kopf with our handlers."""

from __future__ import annotations

import logging
import os

import kopf

from rlscale.metrics_names import OPERATOR_METRICS_PORT

from . import (
    handlers,  # noqa: F401  (registers the handlers with kopf)
    metrics,
)


def run(namespaces: list[str] | None = None, metrics_port: int = OPERATOR_METRICS_PORT) -> int:
    """Serve /metrics, then reconcile RLRuns in the given namespaces (all when empty) until stopped."""
    logging.basicConfig(level=os.environ.get("RLSCALE_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # kopf logs every handler call at INFO; at 100 runs that drowns what matters.
    logging.getLogger("kopf").setLevel(os.environ.get("RLSCALE_KOPF_LOG_LEVEL", "WARNING"))
    # One access line per liveness probe (every 20 s in the chart) buries the operator's own.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    bind = os.environ.get("RLSCALE_OPERATOR_BIND", "0.0.0.0")
    metrics.serve(metrics_port, bind)
    health = os.environ.get("RLSCALE_OPERATOR_HEALTH", "")  # e.g. http://0.0.0.0:8081/healthz
    kopf.run(
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces or (),
        liveness_endpoint=health or None,
    )
    return 0
