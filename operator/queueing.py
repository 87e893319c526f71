"""A queued run's Kueue Workload (spec.scheduling.queueName), from creation to Finished.

Kueue owns admission; the operator owns everything else of the Workload's life: it creates
it, changes its pod sets only while no quota is reserved (admitted counts hold until the run
is queued again), makes it inactive while the run is suspended, gives the reservation back
once an evicted run's pods are gone (so Kueue can queue it again), and marks it Finished when
the run ends, which frees the quota. docs/operations.md, "Queueing runs with Kueue"."""

from __future__ import annotations

import json
import logging
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from rlscale.plan import Plan

from . import builders as B
from . import constants as C
from . import status as S
from .kube import KubeAPI

log = logging.getLogger("rlscale.operator")


def sync_workload(api: KubeAPI, run: B.RunRef, spec: Any, plan: Plan, images: B.Images, finished: bool,
                  pods: list[dict[str, Any]]) -> tuple[dict[str, int], tuple[bool, str, str]]:
    """Keep the run's Workload in step with its plan and spec, and return what Kueue has
    admitted by role, with the RLRun's Admitted condition (status, reason, message). `pods`: the
    run's pods as observed (an evicted run gives its reservation back once they are gone)."""
    zeros = dict.fromkeys(B.QUEUED_ROLES, 0)
    queue = spec.scheduling.queue_name
    want = B.build_workload(run, spec, plan, B.build_children(run, spec, plan, images))
    have = api.get(C.KUEUE_API, "Workload", run.namespace, want["metadata"]["name"])
    if finished:
        if have is not None and not _true(have, "Finished"):
            _set_conditions(api, have, [("Finished", True, "Succeeded", "the RLRun has ended")])
        return zeros, (False, "Finished", "the run has ended; its Workload is Finished")
    if have is None:
        try:
            api.apply(want)
        except ApiException as exc:
            if exc.status != 404:
                raise
            profile = spec.scheduling.placement_profile  # its queueName, unless the run named the queue itself
            where = f" (spec.scheduling.queueName, or placement profile {profile!r})" if profile else \
                " (spec.scheduling.queueName)"
            return zeros, (False, "KueueNotInstalled", f"the run's queue is {queue!r}{where}, but this cluster "
                           f"serves no {C.KUEUE_API} Workloads: install Kueue (then restart the operator so it "
                           "watches them), or remove the queue (spec.scheduling.queueName; a profile's is the "
                           "admin's: name one without a queueName)")
        log.info("%s/%s: queued in Kueue LocalQueue %s", run.namespace, run.name, queue)
        return zeros, (False, "Queued", f"waiting for Kueue to admit the run in LocalQueue {queue}")
    st = have.get("status") or {}
    if _true(have, "Evicted"):
        evicted = S.condition(st.get("conditions"), "Evicted")
        if st.get("admission") and not [p for p in pods
                                        if p["metadata"]["labels"].get(C.LABEL_ROLE) in B.QUEUED_ROLES]:
            _set_conditions(api, have, [("QuotaReserved", False, "Pending", evicted.get("message") or "evicted"),
                                   ("Admitted", False, "NoReservation", "the run's pods have stopped")],
                            release=True)
        _set_active(api, have, not spec.suspend)
        return zeros, (False, "Evicted", f"Kueue evicted the run ({evicted.get('reason')}: "
                                         f"{evicted.get('message')}); it waits in LocalQueue {queue} again")
    if not st.get("admission"):
        if _spec_key(have) != _spec_key(want):
            api.apply(want)  # nothing reserved yet: the new plan's pod sets queue instead
        return zeros, (False, "Queued", f"waiting for Kueue to admit the run in LocalQueue {queue}")
    _set_active(api, have, not spec.suspend)
    admitted = B.admitted_counts(have)
    if not any(admitted.values()):
        return zeros, (False, "QuotaReserved", "Kueue reserved quota; waiting for admission checks")
    cq = (st["admission"] or {}).get("clusterQueue", "")
    return admitted, (True, "Admitted", f"admitted by Kueue (ClusterQueue {cq}): "
                                        + ", ".join(f"{r} {n}" for r, n in admitted.items()))


def out_of_step(api: KubeAPI, namespace: str, name: str, status: dict[str, Any]) -> bool:
    """A queued run's status does not say what its Workload does: admitted or not, or evicted
    with its reservation still held (the operator gives it back)."""
    cond = S.condition(status.get("conditions"), C.COND_ADMITTED) or {}
    if S.finished(status) or cond.get("reason") == "KueueNotInstalled":
        return False  # nothing to do, or the condition already says what the cluster lacks
    wl = api.get(C.KUEUE_API, "Workload", namespace, B.names(name)[C.ROLE_QUEUE])
    if wl is None:
        return True
    said = cond.get("status") == "True"
    held = _true(wl, "Evicted") and bool((wl.get("status") or {}).get("admission"))
    return held or said != any(B.admitted_counts(wl).values())


def _spec_key(wl: dict[str, Any]) -> tuple:
    """What the operator sets in a Workload's spec, as a comparable value."""
    sp = wl.get("spec") or {}
    return (sp.get("queueName"), bool(sp.get("active", True)),
            json.dumps([(p["name"], p["count"], p.get("template")) for p in sp.get("podSets") or []], sort_keys=True))


def _set_active(api: KubeAPI, wl: dict[str, Any], active: bool) -> None:
    """spec.active follows the run's suspend: an inactive Workload is evicted and not queued."""
    if bool((wl.get("spec") or {}).get("active", True)) != active:
        api.merge_patch(wl, {"spec": {"active": active}})


def _true(wl: dict[str, Any], type_: str) -> bool:
    return S.is_true((wl.get("status") or {}).get("conditions"), type_)


def _set_conditions(api: KubeAPI, wl: dict[str, Any], changes: list[tuple[str, bool, str, str]],
                    release: bool = False) -> None:
    """Set conditions on a Workload's status (and drop its admission when `release`), guarded by
    its resourceVersion: a Kueue write in between makes this a 409, and the next event retries."""
    conds = (wl.get("status") or {}).get("conditions")
    for type_, ok, reason, message in changes:
        conds = S.set_condition(conds, type_, ok, reason, message, int(wl["metadata"].get("generation") or 0))
    patch: dict[str, Any] = {"status": {"conditions": conds}}
    if release:
        patch["status"]["admission"] = None
    try:
        api.merge_patch(wl, patch, status=True)
    except ApiException as exc:
        if exc.status != 409:
            raise
        raise kopf.TemporaryError(f"Workload {wl['metadata']['name']} changed while being updated", delay=2) from None
