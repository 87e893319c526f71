"""kopf handlers, kept thin: each one says why a run is reconciled and hands it to Controller.reconcile
(operator/reconcile.py). They are registered by `Handlers.register` with the operator's settings (no
handler is registered, and no environment read, on import)."""

from __future__ import annotations

import logging
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from . import builders as B
from . import constants as C
from . import faults as F
from . import guard as G
from . import metrics as M
from . import status as S
from .kube import get_rlrun
from .observed import IndexObserver, index_entry, plain
from .reconcile import Controller
from .settings import OperatorSettings

log = logging.getLogger("rlscale.operator")

_RLRUN = (C.GROUP, C.VERSION, C.PLURAL)
_OWNED = {C.LABEL_MANAGED_BY: C.MANAGED_BY}
# API answers that say "try again" (conflicts past the controller's own retries, throttling, the API
# server or etcd briefly away): kopf.TemporaryError, not a crash of the handler.
TRANSIENT_API_STATUS = (409, 429, 500, 503, 504)
# kopf names an index by its handler's id; handlers get each index as a keyword of that name.
INDEX_PODS, INDEX_DEPLOYMENTS, INDEX_STATEFULSETS = "run_pods", "run_deployments", "run_statefulsets"
# A run's pass that raised is retried after RETRY_BASE_S, doubling per failure of that run in a row up to
# RETRY_CAP_S: one run that fails every pass (a status the API server refuses, say) costs one pass per
# 5 minutes, not one per 2 s, and a transient error still clears within seconds.
RETRY_BASE_S, RETRY_CAP_S = 2.0, 300.0
# What refused a run, as the RLRun handlers report it to kopf (which posts it as an Event).
_REFUSED = {"SpecInvalid": "invalid spec: ", "PlanFailed": "cannot plan: "}


def _observer(kw: dict[str, Any]) -> IndexObserver:
    return IndexObserver(kw[INDEX_PODS], kw[INDEX_DEPLOYMENTS], kw[INDEX_STATEFULSETS])


class Handlers:
    """The operator's kopf handlers over one Controller."""

    def __init__(self, controller: Controller, settings: OperatorSettings):
        self.controller = controller
        self.settings = settings
        self._failures: dict[tuple[str, str], int] = {}  # (namespace, run) -> passes in a row that raised

    def retry_delay(self, namespace: str, name: str) -> float:
        """Count one more failed pass of the run; the pause before kopf tries it again."""
        n = self._failures[(namespace, name)] = self._failures.get((namespace, name), 0) + 1
        return min(RETRY_BASE_S * 2 ** (n - 1), RETRY_CAP_S)

    def register(self, registry: kopf.OperatorRegistry) -> None:
        """Every handler and index, with explicit ids: kopf keeps a handler's progress under its id on
        the RLRun, so the ids stay what they were when the handlers were module functions."""
        r = {"registry": registry}
        # A registry of our own has none of the login handlers kopf's default one comes with.
        kopf.on.login(id="login_via_client", **r)(kopf.login_via_client)
        kopf.on.startup(id="configure", **r)(self.configure)
        kopf.index("v1", "pods", labels=_OWNED, id=INDEX_PODS, **r)(self.index_pod)
        kopf.index("apps", "v1", "deployments", labels=_OWNED, id=INDEX_DEPLOYMENTS, **r)(self.index_workload)
        kopf.index("apps", "v1", "statefulsets", labels=_OWNED, id=INDEX_STATEFULSETS, **r)(self.index_workload)
        # Short retry backoff: a transient API error should not leave a run unreconciled for a minute.
        for on in (kopf.on.resume, kopf.on.create):
            on(*_RLRUN, backoff=2, id="reconcile_rlrun", **r)(self.reconcile_rlrun)
        kopf.on.update(*_RLRUN, field="spec", backoff=2, id="reconcile_rlrun", **r)(self.reconcile_rlrun)
        kopf.on.delete(*_RLRUN, optional=True, id="rlrun_deleted", **r)(self.rlrun_deleted)
        interval = self.settings.progress_interval
        kopf.timer(*_RLRUN, interval=interval, initial_delay=interval, id="progress_timer", **r)(self.progress_timer)
        roll, head = {**_OWNED, C.LABEL_ROLE: C.ROLE_ROLLOUT}, {**_OWNED, C.LABEL_ROLE: C.ROLE_RAY_HEAD}
        kopf.on.event("apps", "v1", "deployments", labels=roll, id="rollout_event", **r)(self.rollout_event)
        kopf.on.event("apps", "v1", "deployments", labels=head, id="ray_head_event", **r)(self.child_event)
        kopf.on.event("apps", "v1", "statefulsets", labels=_OWNED, id="learner_event", **r)(self.learner_event)
        kopf.on.event("kueue.x-k8s.io", "v1beta2", "workloads", labels=_OWNED, id="queue_event", **r)(
            self.queue_event)
        for kind in ("configmaps", "services"):
            kopf.on.event("v1", kind, labels=_OWNED, id="simple_child_event", **r)(self.child_event)
        kopf.on.event("v1", "pods", labels=_OWNED, id="pod_event", **r)(self.pod_event)

    def configure(self, settings: kopf.OperatorSettings, **_: Any) -> None:
        # One replica (the chart uses Recreate): no peering objects needed.
        settings.peering.standalone = True
        # No cluster scans: the CRD ships with the chart (resolved once at start) and namespaces
        # are exact names, so the operator needs no list/watch on CRDs or namespaces.
        settings.scanning.disabled = True
        settings.posting.level = logging.WARNING
        # Keep kopf's bookkeeping under our own prefix and out of status.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="rlscale.dev")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix="rlscale.dev", key="last-handled-configuration")
        settings.execution.max_workers = self.settings.workers
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60

    # ------------------------------------------------------------ indexes: the runs' pods and workloads

    def index_pod(self, body: Any, **_: Any) -> dict[Any, Any] | None:
        return index_entry(body)

    def index_workload(self, body: Any, **_: Any) -> dict[Any, Any] | None:
        return index_entry(body, spec_keys=("replicas",))

    # ------------------------------------------------------------ the RLRun

    def reconcile_rlrun(self, name: str, namespace: str, body: Any, reason: Any, memo: Any, **kw: Any) -> None:
        """Spec created, changed, or seen again at start-up: plan and converge the children. A pass that
        raises is retried after a pause that grows per run (retry_delay)."""
        try:
            o = self.controller.reconcile(namespace, name, str(getattr(reason, "value", reason)), body=plain(body),
                                          observer=_observer(kw), memo=memo)
        except Exception as exc:
            delay = self.retry_delay(namespace, name)
            raise kopf.TemporaryError(f"{type(exc).__name__}: {exc}"[:500], delay=delay) from exc
        self._failures.pop((namespace, name), None)
        # The cluster's refusals (its policy, an object in the way) are Failed with an Event of the
        # controller's own, and the progress timer tries again: kopf is not to give up on the run.
        if o is not None and o.refusal is not None and o.refusal[0] not in G.CLUSTER_REFUSALS:
            reason_, message = o.refusal
            raise kopf.PermanentError(_REFUSED.get(reason_, "") + message)

    def rlrun_deleted(self, name: str, namespace: str, **_: Any) -> None:
        """Children go with the owner references; only the metric series and what the controller
        remembers of the run are ours to drop."""
        M.forget(namespace, name)
        self.controller.forget(namespace, name)
        self._failures.pop((namespace, name), None)

    def progress_timer(self, name: str, namespace: str, body: Any, memo: Any, **kw: Any) -> None:
        """Every progressInterval: fold the learner's progress report into status, re-plan from its
        measurements when a re-plan is due, and catch up on what no event said (Kueue's admission)."""
        try:
            self.controller.reconcile(namespace, name, "progress", body=plain(body), observer=_observer(kw),
                                      memo=memo)
        except ApiException as exc:
            if exc.status in TRANSIENT_API_STATUS:  # kopf logs it and runs the timer again
                raise kopf.TemporaryError(f"{exc.status} {exc.reason}", delay=self.settings.progress_interval) from exc
            raise

    # ------------------------------------------------------------ children: readiness, health and repair

    def rollout_event(self, type: str | None, labels: Any, namespace: str, **kw: Any) -> None:
        """Rollout Deployment changed: readiness into status; deleted: recreate."""
        self._workload_event(type, labels, namespace, "rollout", kw)

    def learner_event(self, type: str | None, labels: Any, namespace: str, **kw: Any) -> None:
        """Learner StatefulSet changed: readiness into status; deleted: recreate."""
        self._workload_event(type, labels, namespace, "learner", kw)

    def _workload_event(self, type: str | None, labels: Any, namespace: str, trigger: str, kw: dict) -> None:
        if labels.get(C.LABEL_RUN):
            self.repair(namespace, labels[C.LABEL_RUN], "repair" if type == "DELETED" else trigger, kw)

    def child_event(self, type: str | None, labels: Any, namespace: str, **kw: Any) -> None:
        """The Ray head Deployment, a ConfigMap or a Service was deleted behind our back: recreate it."""
        if type == "DELETED" and labels.get(C.LABEL_RUN):
            self.repair(namespace, labels[C.LABEL_RUN], "repair", kw)

    def queue_event(self, labels: Any, namespace: str, **kw: Any) -> None:
        """Kueue admitted, evicted or finished a run's Workload (or it was deleted): re-converge the
        run, which scales it to what is admitted."""
        if labels.get(C.LABEL_RUN):
            self.repair(namespace, labels[C.LABEL_RUN], "queue", kw)

    def pod_event(self, type: str | None, body: Any, labels: Any, namespace: str, memo: Any, **kw: Any) -> None:
        """A pod of a run changed: Degraded while any pod of the run is failing (crash loop, image
        pull, no node fits), Failed once its faults (restarts, disruptions) pass
        spec.failurePolicy.backoffLimit or a pod waits past its start deadline."""
        run = labels.get(C.LABEL_RUN)
        if not run:
            return
        pod = plain(body)
        if type == "DELETED":
            # An evicted or preempted pod counts against the budget, though no pass may have seen it before
            # it went (kopf's batching can leave only this event): the pass takes it from here.
            gone = [pod] if F.disruption(pod) else []
            if labels.get(C.LABEL_ROLE) in B.QUEUED_ROLES:
                # A stopping run moves on once its pods are gone: the rollout replicas follow the last
                # learner, and a run Kueue evicted gives its reservation back.
                sp = (get_rlrun(self.controller.api, namespace, run) or {}).get("spec") or {}
                if sp.get("suspend") or (sp.get("scheduling") or {}).get("queueName"):
                    self.repair(namespace, run, "drain", kw, gone)
                    return
            # A healthy pod's going changes no condition; a failing one's may clear Degraded.
            if S.pod_signature(pod) != S.HEALTHY_POD:
                self.repair(namespace, run, "pod", kw, gone)
            return
        # The pod's memo holds what of it bears on health when last seen: an event that leaves that as it
        # was (a healthy pod becoming ready, say) needs no pass.
        signature = S.pod_signature(pod)
        if memo.get("health", S.HEALTHY_POD) == signature:
            return
        memo["health"] = signature
        self.repair(namespace, run, "pod", kw)

    def repair(self, namespace: str, run: str, trigger: str, kw: dict[str, Any],
               gone: list[dict[str, Any]] | tuple = ()) -> None:
        """A pass over the run for a change of one of its children (none when the run itself is going).
        A refusal needs no raising here: the Invalid condition says it."""
        self.controller.reconcile(namespace, run, trigger, observer=_observer(kw), gone=gone)
