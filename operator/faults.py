"""The run's failure budget (spec.failurePolicy.backoffLimit), counted in faults, not container restarts.

One rank's fault restarts every learner rank (the trainer's gang restart, trainer/gang.py), and the loss
of the Ray head restarts every rollout pod and, once the new head answers or 120 s pass without one
(HeadWatch), the learners: counting restarts, a run of five pods of a role failed on its first
recoverable fault. Here restarts of different pods within WINDOW_SECONDS of a fault's first restart are
that one fault; a second restart of the same pod is a new fault (a crash loop still counts every
restart). Once the run has made checkpoint.every steps past its last fault (it checkpointed since),
the count goes back to 0.

A pod ended from outside counts too, as JobSet and Kubernetes Jobs count a failed pod: one the API
server marked DisruptionTarget (an eviction, a preemption, its node lost or tainted, its node's
kubelet stopping it) or one in phase Failed (a kubelet eviction under node pressure). Each such pod
(by uid) is counted once, in the same window as restarts: a drained node's ranks are one fault.

The record lives in status.faults (the operator may restart: nothing is kept in memory):
  count          faults not yet forgiven
  restarts       {pod: restarts last seen}, pods with any; a pod left out had none
  uids           {pod: uid} for those pods: a pod recreated under its name starts again from 0
  windowStart    when the current fault's first restart was seen; windowPods: the pods restarted in it
  lastFaultStep  the run's step when the last fault was counted (None: before any step)
  lastRole       the role of the pod that started the last fault
  lastCause      what ended a pod from outside, in words, when that started the last fault
  disrupted      the uids (else names) of the disrupted pods counted, the last DISRUPTED_KEEP
Pure: the pass's time comes in as `now`."""

from __future__ import annotations

import datetime as dt
from typing import Any

from . import constants as C

# Restarts of different pods this close to a fault's first are that fault. The slowest follower of
# one cause is a learner waiting out HeadWatch's 120 s patience (plus its 10 s probe) after a Ray
# head loss; rollout pods go once the new head answers (rollout/entrypoint.py watch_head; at Ray's
# 60 s GCS reconnect timeout where that watch misses it), ranks of a gang restart within
# seconds. 180 s leaves 50 s for the kubelet's restart and the pod event to reach the operator,
# and is shorter than the crash-loop back-off soon gets (a crash-looping pod counts every restart
# anyway).
WINDOW_SECONDS = 180
# The uids of the last DISRUPTED_KEEP disrupted pods counted are kept: a pod is seen in several passes (a
# kubelet-evicted rollout pod stays, phase Failed, until the pod GC), and must count once.
DISRUPTED_KEEP = 256
# DisruptionTarget reasons (set by the API server, the scheduler, the taint manager, the pod GC and the kubelet).
DISRUPTIONS = {"EvictionByEvictionAPI": "evicted", "PreemptionByScheduler": "preempted",
               "DeletionByTaintManager": "deleted by the taint manager (its node lost or tainted)",
               "DeletionByPodGC": "deleted by the pod GC (its node gone)",
               "TerminationByKubelet": "stopped by its node's kubelet"}


def _time(iso: str) -> dt.datetime:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00"))


def pod_restarts(pod: dict[str, Any], with_init: bool) -> int:
    """One pod's container restarts; its init containers' too when `with_init` (before the first step:
    a run that never starts, a model not in the cache, must still fail)."""
    st = pod.get("status") or {}
    statuses = [*(st.get("initContainerStatuses") or [] if with_init else []), *(st.get("containerStatuses") or [])]
    return sum(int(cs.get("restartCount") or 0) for cs in statuses)


def disruption(pod: dict[str, Any]) -> str | None:
    """Why a pod of the run was ended from outside, in words, else None. The run's pods all restart
    their containers (restartPolicy Always), so phase Failed is the node's doing, never the process's."""
    name = (pod.get("metadata") or {}).get("name", "?")
    st = pod.get("status") or {}
    for c in st.get("conditions") or []:
        if c.get("type") == "DisruptionTarget" and c.get("status") == "True":
            reason = str(c.get("reason") or "DisruptionTarget")
            said = f": {str(c['message'])[:200]}" if c.get("message") else ""
            return f"pod {name} {DISRUPTIONS.get(reason, 'disrupted')} ({reason}{said})"
    if st.get("phase") == "Failed":
        said = f": {str(st['message'])[:200]}" if st.get("message") else ""
        return f"pod {name} failed on its node ({st.get('reason') or 'Failed'}{said})"
    return None


def current_step(report: dict[str, Any] | None, progress: dict[str, Any] | None) -> int | None:
    """The run's step: the report's (this pass's), else status.progress's; None before any."""
    for src in (report, progress):
        if src and src.get("step") is not None:
            return int(src["step"])
    return None


def count(record: dict[str, Any] | None) -> int:
    return int((record or {}).get("count") or 0)


def exceeded(record: dict[str, Any] | None, backoff_limit: int) -> bool:
    """The run's faults have passed spec.failurePolicy.backoffLimit: it has failed."""
    return count(record) > backoff_limit


def advance(prev: dict[str, Any] | None, pods: list[dict[str, Any]], step: int | None, every: int,
            now: str, window: float = WINDOW_SECONDS, gone: list[dict[str, Any]] | tuple = ()) -> dict[str, Any]:
    """status.faults moved on by the pods seen at `now` with the run at `step` (checkpoint.every `every`);
    `gone`: pods deleted since (a disrupted one counts, though no pass saw it before it went)."""
    prev = prev or {}
    rec = dict(prev)
    n = int(prev.get("count") or 0)
    last_step = prev.get("lastFaultStep")
    if n and step is not None and step - int(last_step or 0) >= max(every, 1):
        n = 0  # the run checkpointed since its last fault: forgiven
    grew, restarts, uids = _restarts(prev, pods, progressed=step is not None and step > 0)
    disrupted = list(prev.get("disrupted") or [])
    for pod in [*pods, *gone]:
        meta = pod.get("metadata") or {}
        key, cause = meta.get("uid") or meta.get("name", "?"), disruption(pod)
        if cause and key not in disrupted:
            disrupted.append(key)
            grew.append((meta.get("name", "?"), (meta.get("labels") or {}).get(C.LABEL_ROLE, "?"), 1, cause))
    start, in_window = prev.get("windowStart"), list(prev.get("windowPods") or [])
    for name, role, times, cause in grew:
        for _ in range(times):
            if start and (_time(now) - _time(start)).total_seconds() <= window and name not in in_window:
                in_window.append(name)  # another pod of the same fault
            else:
                n, start, in_window = n + 1, now, [name]
                rec.update(lastFaultStep=step, lastRole=role, lastCause=cause)
    rec.update(count=n, restarts=restarts, uids=uids, disrupted=disrupted[-DISRUPTED_KEEP:])
    if start:
        rec.update(windowStart=start, windowPods=in_window)
    keep = n or restarts or start or disrupted
    return {k: v for k, v in rec.items() if v not in ({}, [], None)} if keep else {}


def _restarts(prev: dict[str, Any], pods: list[dict[str, Any]], progressed: bool
              ) -> tuple[list[tuple[str, str, int, str | None]], dict[str, int], dict[str, str]]:
    """The pods whose restarts grew since `prev` (name, role, by how many, no cause), and the
    restarts and uids to remember."""
    seen_before, uids_before = prev.get("restarts") or {}, prev.get("uids") or {}
    restarts: dict[str, int] = {}
    uids: dict[str, str] = {}
    grew: list[tuple[str, str, int, str | None]] = []
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name", "")):
        meta = pod.get("metadata") or {}
        name, uid = meta.get("name", "?"), meta.get("uid")
        k = pod_restarts(pod, with_init=not progressed)
        same = uid is None or uids_before.get(name) in (None, uid)
        base = int(seen_before.get(name) or 0) if same else 0
        if k > base:  # fewer: the pod was recreated (or its init containers stopped counting): a new baseline
            grew.append((name, (meta.get("labels") or {}).get(C.LABEL_ROLE, "?"), k - base, None))
        if k:
            restarts[name] = k
            if uid:
                uids[name] = uid
    return grew, restarts, uids


def message(record: dict[str, Any], backoff_limit: int) -> str:
    """What the Failed condition says (the last exit follows it)."""
    n = count(record)
    what = (f"the last: {record['lastCause']}; " if record.get("lastCause")
            else f"restarts of the {record.get('lastRole', '?')} pods, ")
    return (f"{n} fault{'s' if n != 1 else ''} ({what}those of different pods within {WINDOW_SECONDS} s one "
            f"fault) exceed spec.failurePolicy.backoffLimit ({backoff_limit})")


def counted(record: dict[str, Any], backoff_limit: int) -> str:
    """What the Event says of a fault counted under the limit."""
    what = record.get("lastCause") or f"restarts of the {record.get('lastRole', '?')} pods"
    return (f"fault {count(record)} of the {backoff_limit} spec.failurePolicy.backoffLimit allows: {what}; the run "
            "goes on from its last checkpoint")
