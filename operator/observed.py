"""What one reconcile pass observed and decided (`Observed`), and where it observes a run's pods and
workloads: kopf's indexes in the operator (no list call per event), the API itself in the tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlscale.plan import Plan
from rlscale.plan.replan import ReplanState
from rlscale.spec import RLRunSpec

from . import builders as B
from . import constants as C
from .kube import KubeAPI

WORKLOAD_KINDS = {C.ROLE_RAY_HEAD: ("apps/v1", "Deployment"), C.ROLE_ROLLOUT: ("apps/v1", "Deployment"),
                  C.ROLE_LEARNER: ("apps/v1", "StatefulSet")}


@dataclass
class Observed:
    """One pass over one RLRun: what it read, what its steps decided and did. The status is computed
    from this alone (status.compute_status), so every handler's pass ends in the same status."""

    rlrun: dict[str, Any]  # as read: metadata (generation, annotations), spec, the previous status
    trigger: str  # what started the pass: create, update, resume, repair, queue, drain, progress, pod, ...
    pods: list[dict[str, Any]]  # the run's pods
    workloads: dict[str, dict[str, Any]]  # by role (ray-head, rollout, learner), as last seen
    spec: RLRunSpec | None = None
    refusal: tuple[str, str] | None = None  # (reason, message): what the spec or the cluster cannot run
    retried: bool = False  # a Failed run whose spec changed: its failure cleared, started again
    report: dict[str, Any] | None = None  # the driver's progress report (wire form), unless stale
    images: B.Images | None = None  # the defaults its children are built from (status.images, else settings)
    finished: bool = False  # the run has ended (before or in this pass): its workloads go to zero
    faults: dict[str, Any] | None = None  # status.faults after this pass (operator/faults.py); None: not yet
    gone: list[dict[str, Any]] = field(default_factory=list)  # pods deleted since, disrupted (the pod handler's)
    waiting: dict[str, Any] | None = None  # status.waiting after this pass (operator/deadlines.py); None: not yet
    start_time: str | None = None  # status.startTime after this pass
    ended: tuple[str, str] | None = None  # (reason, message): a deadline this pass found past
    plan: Plan | None = None  # what the children are built from
    planned: str | None = None  # why the plan is new in this pass (a trigger, or "replan"); None: kept
    replan: ReplanState | None = None  # the re-planner's gate after this pass (None: unchanged)
    replan_message: str | None = None
    calibration: dict[str, Any] | None = None  # what a switching re-plan calibrated from
    apply: bool = False  # the children are (re)applied in this pass
    admission: tuple[bool, str, str] | None = None  # Kueue's Admitted condition (queued runs)
    admitted: dict[str, int] | None = None
    applied: dict[str, dict[str, Any]] = field(default_factory=dict)  # workloads as the applies returned them
    desired: dict[str, int] | None = None  # replicas by role applied in this pass
    owned: frozenset[tuple[str, str, str]] = frozenset()  # (apiVersion, kind, name) checked absent or the run's
    token: str | None = None  # the run's Ray token Secret, known to be its own ("": one of that name is not)
    done: bool = False  # every step ran: the plan part of status may move on
    error: Exception | None = None  # what stopped the pass (raised again once status is written)

    @property
    def generation(self) -> int:
        return int(self.rlrun["metadata"].get("generation") or 0)

    @property
    def status(self) -> dict[str, Any]:
        """The previous status."""
        return self.rlrun.get("status") or {}

    @property
    def namespace(self) -> str:
        return self.rlrun["metadata"]["namespace"]

    @property
    def name(self) -> str:
        return self.rlrun["metadata"]["name"]

    def run_ref(self) -> B.RunRef:
        return B.RunRef(name=self.name, namespace=self.namespace, uid=self.rlrun["metadata"]["uid"])

    def workload(self, role: str) -> dict[str, Any] | None:
        """The role's workload as last seen (the watch), else as this pass's apply returned it."""
        return self.workloads.get(role) or self.applied.get(role)


class Observer(Protocol):
    def pods(self, namespace: str, run: str) -> list[dict[str, Any]]: ...

    def workloads(self, namespace: str, run: str) -> dict[str, dict[str, Any]]: ...


class ApiObserver:
    """Reads the pods and workloads through the API (the tests' fake; a pass outside kopf)."""

    def __init__(self, api: KubeAPI):
        self.api = api

    def pods(self, namespace: str, run: str) -> list[dict[str, Any]]:
        return self.api.list_pods(namespace, run)

    def workloads(self, namespace: str, run: str) -> dict[str, dict[str, Any]]:
        n = B.names(run)
        found = {role: self.api.get(*WORKLOAD_KINDS[role], namespace, n[role]) for role in WORKLOAD_KINDS}
        return {role: w for role, w in found.items() if w is not None}


class IndexObserver:
    """kopf's indexes of the runs' pods and workloads by (namespace, run), which the watches keep."""

    def __init__(self, pods: Mapping[Any, Iterable[dict[str, Any]]],
                 *workloads: Mapping[Any, Iterable[dict[str, Any]]]):
        self._pods = pods
        self._workloads = workloads

    def pods(self, namespace: str, run: str) -> list[dict[str, Any]]:
        return list(self._pods.get((namespace, run), ()))

    def workloads(self, namespace: str, run: str) -> dict[str, dict[str, Any]]:
        return {w["metadata"]["labels"].get(C.LABEL_ROLE): w
                for index in self._workloads for w in index.get((namespace, run), ())}


def index_entry(body: Mapping[str, Any], spec_keys: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """{(namespace, run): the parts of the object a pass reads}, for a kopf index; None for an object
    of no run. Only those are kept (metadata, status, `spec_keys` of spec): the operator holds every
    pod of every run."""
    meta = body.get("metadata") or {}
    labels = dict(meta.get("labels") or {})
    run = labels.get(C.LABEL_RUN)
    if not run:
        return None
    kept = {k: plain(meta[k]) for k in ("name", "namespace", "uid", "generation", "annotations", "deletionTimestamp")
            if meta.get(k) is not None}
    spec = body.get("spec") or {}
    out = {"metadata": {**kept, "labels": labels}, "status": plain(body.get("status") or {}),
           "spec": {k: plain(spec[k]) for k in spec_keys if k in spec}}
    return {(meta.get("namespace"), run): out}


def plain(x: Any) -> Any:
    """kopf's body views (Spec, Status, Meta) as plain dicts and lists."""
    if isinstance(x, Mapping):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [plain(v) for v in x]
    return x
