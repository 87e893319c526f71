"""The operator's own Prometheus metrics (rlscale_operator_*), served on :8080/metrics."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from rlscale.metrics_names import OPERATOR_PREFIX as P

from . import constants as C

RECONCILES = Counter(f"{P}reconciles", "RLRun reconciles, by result.", ["result"])
ERRORS = Counter(f"{P}reconcile_errors", "Reconciles that raised, by kind of error.", ["kind"])
RECONCILE_SECONDS = Histogram(f"{P}reconcile_seconds", "Time of one RLRun reconcile (plan and apply).",
                              buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
PLANNED_BATCH = Gauge(f"{P}planned_batch_samples", "Planned samples per step (prompts x samplesPerPrompt).",
                      ["namespace", "run"])
REPLICAS = Gauge(f"{P}replicas", "Replicas by role, desired and ready.", ["namespace", "run", "role", "state"])
PREDICTED_TTT = Gauge(f"{P}predicted_time_to_target_seconds", "The plan's predicted time-to-target (absent while its "
                      "samples-to-target is a placeholder, not a measurement).",
                      ["namespace", "run"])
LEADER = Gauge(f"{P}leader", "1 while this replica holds the leader Lease and reconciles, 0 while it stands by.")
REPLANS = Counter(f"{P}replans", "Re-plans that switched a run's configuration, by trigger (replan).", ["trigger"])
# A run's status as series to alert on, as kube-state-metrics shows a pod's: one series per phase (1 for the
# run's phase, 0 for the others) and per (condition, status), so `...{phase="Failed"} == 1` selects failed runs.
RUN_PHASE = Gauge(f"{P}run_phase", "1 for the RLRun's status.phase, 0 for the other phases.",
                  ["namespace", "run", "phase"])
RUN_CONDITION = Gauge(f"{P}run_condition", "1 for the status (True, False, Unknown) of each of the RLRun's "
                      "conditions, 0 for the other two.", ["namespace", "run", "condition", "status"])
RUN_STEPS = Gauge(f"{P}run_steps", "The optimiser steps the RLRun's driver last reported (status.progress.step).",
                  ["namespace", "run"])
RUN_PROGRESS_TIME = Gauge(f"{P}run_last_progress_timestamp_seconds", "Unix time at which this replica last saw the "
                          "RLRun's step move, or its phase change: `time() - this` is how long a Running run has "
                          "gone without a new step.", ["namespace", "run"])
# (namespace, run) -> (phase, step) as last recorded, to tell when either moved.
_seen: dict[tuple[str, str], tuple[Any, Any]] = {}
PHASES = (C.PHASE_PENDING, C.PHASE_QUEUED, C.PHASE_RUNNING, C.PHASE_SUSPENDED, C.PHASE_SUCCEEDED,
          C.PHASE_BUDGET_EXHAUSTED, C.PHASE_FAILED)
CONDITION_STATUSES = ("True", "False", "Unknown")


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Start the /metrics endpoint in a background thread (port 0 disables it)."""
    if port:
        start_http_server(port, addr=addr)


def record_status(namespace: str, run: str, status: dict[str, Any] | None) -> None:
    """The run's phase, conditions and steps from its status, after every pass that wrote or kept one."""
    status = status or {}
    current = status.get("phase")
    if current:
        for ph in PHASES:
            RUN_PHASE.labels(namespace, run, ph).set(1 if ph == current else 0)
    for cond in status.get("conditions") or []:
        ctype, cstat = cond.get("type"), cond.get("status")
        if ctype in C.CONDITION_TYPES:
            for s in CONDITION_STATUSES:
                RUN_CONDITION.labels(namespace, run, ctype, s).set(1 if s == cstat else 0)
    step = (status.get("progress") or {}).get("step")
    if isinstance(step, (int, float)) and not isinstance(step, bool):
        RUN_STEPS.labels(namespace, run).set(step)
    else:
        step = None
    if _seen.get((namespace, run)) != (current, step):
        _seen[(namespace, run)] = (current, step)
        RUN_PROGRESS_TIME.labels(namespace, run).set(time.time())


def record_predicted_time(namespace: str, run: str, seconds: float | None) -> None:
    """The plan's predicted time-to-target; None (it rests on a placeholder samples-to-target,
    rlscale/plan/headline.py) removes the series rather than publish a made-up time."""
    if seconds is None:
        _remove(PREDICTED_TTT, namespace, run)
    else:
        PREDICTED_TTT.labels(namespace, run).set(seconds)


def forget(namespace: str, run: str) -> None:
    """Drop a deleted run's series so they do not linger at their last value."""
    for ph in PHASES:
        _remove(RUN_PHASE, namespace, run, ph)
    for ctype in C.CONDITION_TYPES:
        for s in CONDITION_STATUSES:
            _remove(RUN_CONDITION, namespace, run, ctype, s)
    _remove(RUN_STEPS, namespace, run)
    _remove(RUN_PROGRESS_TIME, namespace, run)
    _seen.pop((namespace, run), None)
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


def _remove(gauge: Gauge, *labels: str) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:
        pass
