"""A run's deadlines, as Kubernetes Jobs and JobSet keep them, so that no run holds its GPUs for ever:

- spec.activeDeadlineSeconds: a run active longer (from status.startTime: set when it first runs, again
  when it is resumed or retried, as a Job's startTime is) is Failed with reason DeadlineExceeded;
- spec.failurePolicy.podStartTimeoutSeconds: a pod of the run waiting that long in a state that does not
  clear by itself (an image that does not pull, a Secret or ConfigMap it names missing, no node that
  fits it) ends the run as Failed, the kubelet's or scheduler's reason its condition's reason. A crash
  loop is the failure budget's (operator/faults.py).

The record, status.waiting: {pod: {reason, since, uid}}: since when each pod has waited in a state of
one kind (an image pull that goes from ErrImagePull to ImagePullBackOff and back waits on). Pure: the
pass's time comes in as `now`."""

from __future__ import annotations

import datetime as dt
from typing import Any

from . import constants as C

# Waiting reasons of a container that cannot start, by kind (the fix each needs).
STUCK = {"ErrImagePull": "image", "ImagePullBackOff": "image", "InvalidImageName": "image",
         "ErrImageNeverPull": "image", "CreateContainerConfigError": "config", "CreateContainerError": "config"}
UNSCHEDULABLE = "Unschedulable"
DEADLINE_EXCEEDED = "DeadlineExceeded"
# Failed reasons set here (besides the budget's BackoffLimitExceeded): each ends the run.
REASONS = (DEADLINE_EXCEEDED, UNSCHEDULABLE, *STUCK)


def _time(iso: str) -> dt.datetime:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00"))


def _seconds(since: str, now: str) -> float:
    return (_time(now) - _time(since)).total_seconds()


def stuck_state(pod: dict[str, Any], unschedulable_counts: bool = True) -> tuple[str, str] | None:
    """(reason, words) of a pod waiting in a state that does not clear by itself, else None."""
    meta, st = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or st.get("phase") in ("Failed", "Succeeded"):
        return None
    name = meta.get("name", "?")
    for cs in [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK:
            said = f": {str(waiting['message'])[:300]}" if waiting.get("message") else ""
            return waiting["reason"], f"pod {name} container {cs.get('name')}: {waiting['reason']}{said}"
    for c in st.get("conditions") or []:
        if (unschedulable_counts and c.get("type") == "PodScheduled" and c.get("status") == "False"
                and c.get("reason") == UNSCHEDULABLE):
            return UNSCHEDULABLE, f"pod {name} cannot be scheduled: {str(c.get('message') or '')[:300]}"
    return None


def _kind(reason: str) -> str:
    return STUCK.get(reason, reason)


def waiting_after(prev: dict[str, Any] | None, pods: list[dict[str, Any]], now: str,
                  exempt_unschedulable: tuple[str, ...] = ()) -> dict[str, Any]:
    """status.waiting moved on by the pods seen at `now`; a pod that left its state leaves the record.
    Unschedulable pods of the roles in `exempt_unschedulable` wait without a deadline (rollout pods while
    the driver serves with fewer replicas: it takes each once placed)."""
    prev = prev or {}
    out: dict[str, Any] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        role = (meta.get("labels") or {}).get(C.LABEL_ROLE, "?")
        state = stuck_state(pod, role not in exempt_unschedulable)
        if state is None:
            continue
        name, uid = meta.get("name", "?"), meta.get("uid")
        before = prev.get(name) or {}
        same = bool(before) and before.get("uid") == uid and _kind(str(before.get("reason"))) == _kind(state[0])
        out[name] = {"reason": state[0], "since": before["since"] if same and before.get("since") else now,
                     **({"uid": uid} if uid else {})}
    return out


def stuck_past(record: dict[str, Any] | None, pods: list[dict[str, Any]], now: str,
               timeout: int) -> tuple[str, str] | None:
    """(reason, message) for the Failed condition when a pod has waited past `timeout` seconds (0: never)."""
    if timeout <= 0 or not record:
        return None
    by_name = {(p.get("metadata") or {}).get("name"): p for p in pods}
    for name, w in sorted(record.items(), key=lambda kv: str(kv[1].get("since"))):
        waited = _seconds(str(w["since"]), now)
        state = stuck_state(by_name.get(name) or {})
        if waited > timeout and state is not None:
            return state[0], (f"{state[1]}; waited {waited:.0f} s, past spec.failurePolicy.podStartTimeoutSeconds "
                              f"({timeout})")
    return None


def start_time(previous: str | None, now: str, suspended: bool, retried: bool) -> str | None:
    """status.startTime: when the run last started to run (None while suspended: resumed, it starts anew)."""
    if suspended:
        return None
    return now if retried or not previous else previous


def deadline_past(start: str | None, now: str, deadline: int | None) -> tuple[str, str] | None:
    """(reason, message) for the Failed condition once the run has been active past spec.activeDeadlineSeconds."""
    if not deadline or not start:
        return None
    active = _seconds(start, now)
    if active <= deadline:
        return None
    return DEADLINE_EXCEEDED, (f"the run was active {active:.0f} s since {start}, past spec.activeDeadlineSeconds "
                               f"({deadline})")
