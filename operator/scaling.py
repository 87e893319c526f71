"""Ordered scaling of a run's rollout Deployment: a scale-down removes pods only after the driver has
drained their replicas, and exactly those pods.

The driver scales Serve down first (the removed replicas finish their in-flight requests within their
graceful shutdown), then reports the replica count it asked for (`rolloutTarget`), the replicas
running (`rolloutServing`) and the pods still hosting one (`rolloutPods`: starting, running or
draining). Until that report shows the plan's count, the operator keeps the Deployment at its
replicas; then it marks every other rollout pod with a low `controller.kubernetes.io/pod-deletion-cost`
(its replica is gone) and lowers `spec.replicas`, so the ReplicaSet controller deletes those pods.
docs/architecture.md, "Ordered scaling"."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from . import constants as C
from .kube import KubeAPI
from .naming import names

log = logging.getLogger("rlscale.operator")

# The ReplicaSet controller deletes a pod of lower cost first, after pods that are not scheduled,
# not running or not ready (kube-controller-manager's ranking; the annotation is beta and on by
# default since Kubernetes 1.22).
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
DRAINED_COST = "-1000"
# A hold the driver never ends (a step that never finishes, say) gives way after this long: the
# Deployment is lowered without the driver's word, as before ordered scaling.
HOLD_LIMIT_S = 1800.0


@dataclass(frozen=True)
class RolloutScale:
    """What a pass does to the rollout Deployment's count: keep it at `hold` (the driver has not
    drained yet), or lower it to the plan's after marking the pods in `release` (no replica) and
    unmarking those in `keep` (a marked pod that hosts a replica again)."""

    hold: int | None = None
    release: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    message: str = ""


def _role(pod: Mapping[str, Any]) -> str | None:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(C.LABEL_ROLE)


def _cost(pod: Mapping[str, Any]) -> str | None:
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(DELETION_COST)


def driver_running(pods: Iterable[Mapping[str, Any]], run: str) -> bool:
    """Rank 0's pod is there, not going, and its learner container runs: a driver that will drain."""
    rank0 = f"{names(run)[C.ROLE_LEARNER]}-0"
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("name") != rank0 or meta.get("deletionTimestamp"):
            continue
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        return any(cs.get("name") == C.ROLE_LEARNER and (cs.get("state") or {}).get("running") is not None
                   for cs in statuses)
    return False


def ordered_rollout(planned: int, current: int | None, report: Mapping[str, Any] | None,
                    pods: list[dict[str, Any]], run: str) -> RolloutScale:
    """The rollout Deployment's count this pass, from the plan's (`planned`), the Deployment's as
    observed (`current`), the driver's report and the run's pods. Only a scale-down to one or more
    replicas waits for the driver; at zero (suspend, the end, an eviction) the learners stop first
    (Controller._draining). No driver to drain (none running, a failure report, one that reports no
    rollout fields): lowered at once."""
    if current is None or planned <= 0 or current <= planned:
        return RolloutScale()
    rep = report or {}
    target, serving = rep.get("rolloutTarget"), rep.get("rolloutServing")
    if not isinstance(target, int) or not isinstance(serving, int) or rep.get("failed") \
            or not driver_running(pods, run):
        return RolloutScale()
    ours = [p for p in pods if _role(p) == C.ROLE_ROLLOUT and not p["metadata"].get("deletionTimestamp")]
    existing = {p["metadata"]["name"] for p in ours}
    hosting = {str(n) for n in rep.get("rolloutPods") or [] if isinstance(n, str)} & existing
    if target != planned or serving > planned or len(hosting) > planned:
        return RolloutScale(hold=current, message=(
            f"keeping {current} rollout pods until the driver has drained to the plan's {planned} "
            f"(it asks Serve for {target}, {serving} run, {len(hosting)} pods host one)"))
    if serving and not hosting:
        return RolloutScale()  # replicas that do not name their pods: readiness ranks the pods alone
    release = tuple(sorted(n for n in existing - hosting))
    keep = tuple(sorted(p["metadata"]["name"] for p in ours
                        if p["metadata"]["name"] in hosting and _cost(p) == DRAINED_COST))
    return RolloutScale(release=release, keep=keep)


def stopping(pods: Iterable[Mapping[str, Any]], workloads: Mapping[str, Mapping[str, Any]], now: str) -> int:
    """An ended run's rollout pods still there, while its Ray head is up: the head stays until they are
    gone. On SIGTERM a rollout pod's `ray start --block` drains its node through the head's GCS; scaled
    down together, the head went first and the drain call waited out Ray's 60 s GCS reconnect timeout
    (60.1 s against 1.2 s with the head up: `python bench/ray_drain.py`, Ray 2.60). A pod past its
    deletionTimestamp (its grace is over: a lost node's) holds nothing; nor does a head already at zero
    (an operator restarted late must not start a new one), nor one asked to go over HEAD_HOLD_S ago.
    `now`: ISO 8601 in UTC (status.now_iso)."""
    if not int(((workloads.get(C.ROLE_RAY_HEAD) or {}).get("spec") or {}).get("replicas") or 0):
        return 0
    t = _iso(now)
    return sum(1 for p in pods if _role(p) == C.ROLE_ROLLOUT and _holds_head(p.get("metadata") or {}, t))


# A rollout pod holds the head at most this long after its deletion was asked for: with the head up it drains
# in about a second, but one stopped while it starts may sit out its whole grace (180 s), and the head with it
# (seen in `make test` on a loaded machine: bad-reward's head still up 120 s after the run failed).
HEAD_HOLD_S = 30


def _holds_head(meta: Mapping[str, Any], now: dt.datetime) -> bool:
    gone = meta.get("deletionTimestamp")
    if gone is None:
        return True
    end = _iso(gone)
    grace = meta.get("deletionGracePeriodSeconds")
    if grace is not None:  # deletionTimestamp is the request plus the grace
        end = min(end, end - dt.timedelta(seconds=int(grace)) + dt.timedelta(seconds=HEAD_HOLD_S))
    return end > now


def _iso(stamp: str) -> dt.datetime:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def mark_pods(api: KubeAPI, namespace: str, release: Iterable[str], keep: Iterable[str]) -> None:
    """Set the low deletion cost on the `release` pods and remove it from the `keep` pods, each read
    afresh and patched against its resourceVersion (a 409 reads it again; a pod gone needs nothing)."""
    release = list(release)
    for name, cost in [*((n, DRAINED_COST) for n in release), *((n, None) for n in keep)]:
        for attempt in range(3):
            pod = api.get("v1", "Pod", namespace, name)
            if pod is None or _cost(pod) == cost:
                break
            try:
                api.merge_patch(pod, {"metadata": {"annotations": {DELETION_COST: cost}}})
                break
            except ApiException as exc:
                if exc.status == 404:
                    break
                if exc.status != 409 or attempt == 2:
                    raise
    if release:
        log.info("%s: rollout pods with no replica, removed first: %s", namespace, ", ".join(release))
