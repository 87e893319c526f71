"""The operator's own Prometheus metrics (rlscale_operator_*), served on :8080/metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from rlscale.metrics_names import OPERATOR_PREFIX as P

RECONCILES = Counter(f"{P}reconciles", "RLRun reconciles, by result.", ["result"])
ERRORS = Counter(f"{P}reconcile_errors", "Reconciles that raised, by kind of error.", ["kind"])
RECONCILE_SECONDS = Histogram(f"{P}reconcile_seconds", "Time of one RLRun reconcile (plan and apply).",
                              buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
PLANNED_BATCH = Gauge(f"{P}planned_batch_samples", "Planned samples per step (prompts x samplesPerPrompt).",
                      ["namespace", "run"])
REPLICAS = Gauge(f"{P}replicas", "Replicas by role, desired and ready.", ["namespace", "run", "role", "state"])
PREDICTED_TTT = Gauge(f"{P}predicted_time_to_target_seconds", "The plan's predicted time-to-target.",
                      ["namespace", "run"])
LEADER = Gauge(f"{P}leader", "1 while this replica holds the leader Lease and reconciles, 0 while it stands by.")
REPLANS = Counter(f"{P}replans", "Re-plans that switched a run's configuration, by trigger (replan).", ["trigger"])


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Start the /metrics endpoint in a background thread (port 0 disables it)."""
    if port:
        start_http_server(port, addr=addr)


def forget(namespace: str, run: str) -> None:
    """Drop a deleted run's series so they do not linger at their last value."""
    for g, extra in ((PLANNED_BATCH, []), (PREDICTED_TTT, [])):
        try:
            g.remove(namespace, run, *extra)
        except KeyError:
            pass
    for role in ("rollout", "learner"):
        for state in ("desired", "ready"):
            try:
                REPLICAS.remove(namespace, run, role, state)
            except KeyError:
                pass
