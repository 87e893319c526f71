"""kopf handlers, kept thin: read the RLRun, plan, build the children, apply them, write status."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from rlscale.spec import RLRunSpec, SpecError, parse_spec

from . import builders as B
from . import constants as C
from . import kube
from . import metrics as M
from . import queueing as Q
from . import status as S
from .planning import PlanError, plan_for

log = logging.getLogger("rlscale.operator")

IMAGES = B.Images.from_env()
# Seconds between progress reads (and drift checks) per run.
PROGRESS_INTERVAL = float(os.environ.get("RLSCALE_PROGRESS_INTERVAL", "10"))
# API answers that say "try again" (conflicts past update_status's own retries, throttling,
# the API server or etcd briefly away): kopf.TemporaryError, not a crash of the handler.
TRANSIENT_API_STATUS = (409, 429, 500, 503, 504)
# Fault injection for the restart test: a pause between child applies widens the window in
# which the operator can be killed mid-reconcile. Zero in production.
STEP_DELAY = float(os.environ.get("RLSCALE_OPERATOR_STEP_DELAY", "0"))
_RLRUN = (C.GROUP, C.VERSION, C.PLURAL)
_OWNED = {C.LABEL_MANAGED_BY: C.MANAGED_BY}


def _plain(x: Any) -> Any:
    """kopf's body views (Spec, Status, Meta) as plain dicts and lists."""
    if x is None:
        return {}
    if isinstance(x, Mapping):
        return {k: _plain(v) if isinstance(v, (Mapping, list)) else v for k, v in x.items()}
    if isinstance(x, list):
        return [_plain(v) if isinstance(v, (Mapping, list)) else v for v in x]
    return x


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
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
    settings.execution.max_workers = int(os.environ.get("RLSCALE_OPERATOR_WORKERS", "8"))
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60


# Short retry backoff: a transient API error should not leave a run unreconciled for a minute.
@kopf.on.resume(*_RLRUN, backoff=2)
@kopf.on.create(*_RLRUN, backoff=2)
@kopf.on.update(*_RLRUN, field="spec", backoff=2)
def reconcile_rlrun(name: str, namespace: str, uid: str, spec: Any, meta: Any, status: Any,
                    reason: str, **_: Any) -> None:
    """Spec created, changed, or seen again at start-up: plan and converge the children."""
    reconcile(namespace, name, uid, _plain(spec), int(meta.get("generation") or 0), _plain(status),
              trigger=str(getattr(reason, "value", reason)))


def reconcile(namespace: str, name: str, uid: str, spec_dict: dict[str, Any], generation: int,
              status: dict[str, Any], trigger: str) -> dict[str, Any]:
    """Validate, plan, create-or-patch every child, record the plan; returns the plan."""
    t0 = time.monotonic()
    try:
        try:
            spec = parse_spec(spec_dict)
        except SpecError as exc:
            _invalid(namespace, name, generation, "SpecInvalid", str(exc))
            raise kopf.PermanentError(f"invalid spec: {exc}") from None
        try:
            plan = plan_for(spec, status.get("calibration"),
                            learners=(status.get("plan") or {}).get("learnerReplicas"))
        except PlanError as exc:
            _invalid(namespace, name, generation, "PlanFailed", str(exc))
            raise kopf.PermanentError(f"cannot plan: {exc}") from None
        run = B.RunRef(name=name, namespace=namespace, uid=uid)
        if trigger == "update" and S.is_true(status.get("conditions"), C.COND_FAILED):
            # A failed run whose spec changed gets another go (a fixed reward, a new image).
            status = _clear_failure(namespace, name, generation) or status
        finished = S.finished(status)
        _ensure_token(run)
        # A queued run waits for Kueue to admit it whole; until then, and after an eviction,
        # its workloads stay at zero (the ConfigMap, Services and checkpoints stay).
        admitted, admission = None, None
        if spec.scheduling.queue_name:
            admitted, admission = Q.sync_workload(run, spec, plan, IMAGES, finished)
        draining = None if finished else _draining(run, B.desired_replicas(spec, plan, finished, admitted))
        applied: dict[str, dict[str, Any]] = {}
        for manifest in B.build_children(run, spec, plan, IMAGES, finished=finished, admitted=admitted,
                                         draining=draining):
            role = manifest["metadata"]["labels"][C.LABEL_ROLE]
            try:
                applied[role if manifest["kind"] in ("Deployment", "StatefulSet")
                        else manifest["kind"]] = kube.apply(manifest)
            except ApiException as exc:
                if exc.status != 404 or manifest["kind"] != "PodGroup":
                    raise
                message = (f"spec.scheduling.podGroup is true, but this cluster serves no {C.POD_GROUP_API} "
                           "PodGroups: install scheduler-plugins' Coscheduling (its PodGroup CRD and a scheduler "
                           "that runs the plugin), or set podGroup to false")
                _invalid(namespace, name, generation, "PodGroupUnavailable", message)
                raise kopf.PermanentError(message) from None
            if STEP_DELAY:
                time.sleep(STEP_DELAY)
        desired = B.desired_replicas(spec, plan, finished, admitted, draining)
        desired.pop(C.ROLE_RAY_HEAD)
        ready = {C.ROLE_ROLLOUT: _ready(applied.get(C.ROLE_ROLLOUT)),
                 C.ROLE_LEARNER: _ready(applied.get(C.ROLE_LEARNER))}
        kube.update_status(namespace, name, lambda body, st: _planned_status(
            st, spec, plan, generation, desired, ready, trigger, admission))
        _record_metrics(namespace, name, plan, desired, ready)
        M.RECONCILES.labels("ok").inc()
        return plan
    except kopf.PermanentError:
        M.RECONCILES.labels("invalid").inc()
        raise
    except kube.NamespaceTerminating:
        # The run goes with its namespace; retrying would only fail again.
        M.RECONCILES.labels("skipped").inc()
        return {}
    except Exception as exc:
        M.RECONCILES.labels("error").inc()
        M.ERRORS.labels(type(exc).__name__).inc()
        raise
    finally:
        M.RECONCILE_SECONDS.observe(time.monotonic() - t0)


_TOKENS: set[str] = set()  # runs (uid) whose Ray token Secret this process saw or made


def _ensure_token(run: B.RunRef) -> None:
    """Create the run's Ray token Secret once; an existing one is kept (its pods hold it)."""
    if run.uid in _TOKENS:
        return
    if kube.create_if_absent(B.build_ray_token_secret(run, B.new_ray_token())):
        log.info("%s/%s: created the run's Ray token Secret", run.namespace, run.name)
    _TOKENS.add(run.uid)


def _clear_failure(namespace: str, name: str, generation: int) -> dict[str, Any] | None:
    def mutate(body: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
        conds = S.set_condition(st.get("conditions"), C.COND_FAILED, False, "SpecChanged",
                                f"spec changed (generation {generation}): retrying", generation)
        st["conditions"] = S.set_condition(conds, C.COND_DEGRADED, False, "SpecChanged", "retrying", generation)
        return st
    # The failed driver's last report would fail the retried run again.
    kube.remove_annotation(namespace, name, C.ANNOTATION_PROGRESS)
    return kube.update_status(namespace, name, mutate)


def _ready(workload: dict[str, Any] | None) -> int:
    return int(((workload or {}).get("status") or {}).get("readyReplicas") or 0)


def _planned_status(st: dict[str, Any], spec: Any, plan: dict[str, Any], generation: int,
                    desired: dict[str, int], ready: dict[str, int], trigger: str,
                    admission: tuple[bool, str, str] | None = None) -> dict[str, Any]:
    conds = st.get("conditions")
    if admission is not None:
        conds = S.set_condition(conds, C.COND_ADMITTED, *admission, generation)
    conds = S.set_condition(conds, C.COND_INVALID, False, "Valid", "spec and plan are valid", generation)
    conds = S.set_condition(conds, C.COND_PLANNED, True, f"Planned{trigger.capitalize()}",
                            str(plan.get("reason", "")), generation)
    conds = S.set_condition(conds, C.COND_SUSPENDED, spec.suspend,
                            "SuspendRequested" if spec.suspend else "Active",
                            "rollout and learners scaled to zero; config and checkpoints kept"
                            if spec.suspend else "not suspended", generation)
    seen = st.get("replicas") or {}
    for role in (C.ROLE_ROLLOUT, C.ROLE_LEARNER):
        # The workload watch records readiness as it happens; an apply response can be older
        # than that record, so it only counts when the desired count just changed.
        if (seen.get(role) or {}).get("desired") == desired[role]:
            ready[role] = int(seen[role].get("ready") or 0)
        conds = S.readiness(role, desired[role], ready[role], generation, conds)
    st["conditions"] = conds
    st["plan"] = S.plan_summary(plan)
    st["replicas"] = {r: {"desired": desired[r], "ready": ready[r]} for r in desired}
    st["observedGeneration"] = generation
    st["phase"] = S.phase(conds, spec.suspend)
    return st


def _draining(run: B.RunRef, desired: dict[str, int]) -> int | None:
    """The rollout replicas to keep while the learners are told to stop (suspend, eviction) and
    some learner pod is still there; None when there is nothing to wait for."""
    if desired[C.ROLE_LEARNER] > 0:
        return None
    pods = kube.list_pods(run.namespace, run.name)
    if not any(p["metadata"]["labels"].get(C.LABEL_ROLE) == C.ROLE_LEARNER for p in pods):
        return None
    dep = kube.get("apps/v1", "Deployment", run.namespace, B.names(run.name)[C.ROLE_ROLLOUT])
    return int(((dep or {}).get("spec") or {}).get("replicas") or 0)


def _invalid(namespace: str, name: str, generation: int, reason: str, message: str) -> None:
    def mutate(body: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
        conds = S.set_condition(st.get("conditions"), C.COND_INVALID, True, reason, message, generation)
        conds = S.set_condition(conds, C.COND_PLANNED, False, reason, "no plan for an invalid run", generation)
        st.update(conditions=conds, observedGeneration=generation, phase=C.PHASE_FAILED)
        return st
    kube.update_status(namespace, name, mutate)


def _record_metrics(namespace: str, name: str, plan: dict[str, Any], desired: dict[str, int],
                    ready: dict[str, int]) -> None:
    M.PLANNED_BATCH.labels(namespace, name).set(int(plan["prompts"]) * int(plan["samplesPerPrompt"]))
    ttt = (plan.get("predicted") or {}).get("timeToTargetSeconds")
    if ttt is not None:
        M.PREDICTED_TTT.labels(namespace, name).set(float(ttt))
    for role in desired:
        M.REPLICAS.labels(namespace, name, role, "desired").set(desired[role])
        M.REPLICAS.labels(namespace, name, role, "ready").set(ready[role])


@kopf.on.delete(*_RLRUN, optional=True)
def rlrun_deleted(name: str, namespace: str, **_: Any) -> None:
    """Children go with the owner references; only the metric series are ours to drop."""
    M.forget(namespace, name)


# ---------------------------------------------------------------- children: readiness and repair


def _on_workload(role: str, event_type: str | None, body: Any, namespace: str, labels: Any) -> None:
    run = labels.get(C.LABEL_RUN)
    if not run:
        return
    if event_type == "DELETED":
        repair(namespace, run)
        return
    spec_replicas = int((body.get("spec") or {}).get("replicas") or 0)
    ready = int((body.get("status") or {}).get("readyReplicas") or 0)

    def mutate(rl: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
        gen = int(rl["metadata"].get("generation") or 0)
        conds = S.readiness(role, spec_replicas, ready, gen, st.get("conditions"))
        st["conditions"] = conds
        st.setdefault("replicas", {})[role] = {"desired": spec_replicas, "ready": ready}
        suspended = bool((rl.get("spec") or {}).get("suspend"))
        if not S.is_true(conds, C.COND_INVALID):
            st["phase"] = S.phase(conds, suspended)
        return st

    kube.update_status(namespace, run, mutate)
    M.REPLICAS.labels(namespace, run, role, "desired").set(spec_replicas)
    M.REPLICAS.labels(namespace, run, role, "ready").set(ready)


@kopf.on.event("apps", "v1", "deployments", labels={**_OWNED, C.LABEL_ROLE: C.ROLE_ROLLOUT})
def rollout_event(type: str | None, body: Any, namespace: str, labels: Any, **_: Any) -> None:
    """Rollout Deployment changed: readiness into status; deleted: recreate."""
    _on_workload(C.ROLE_ROLLOUT, type, body, namespace, labels)


@kopf.on.event("apps", "v1", "deployments", labels={**_OWNED, C.LABEL_ROLE: C.ROLE_RAY_HEAD})
def ray_head_event(type: str | None, namespace: str, labels: Any, **_: Any) -> None:
    """The Ray head Deployment was deleted behind our back: recreate it."""
    if type == "DELETED" and labels.get(C.LABEL_RUN):
        repair(namespace, labels[C.LABEL_RUN])


@kopf.on.event("apps", "v1", "statefulsets", labels=_OWNED)
def learner_event(type: str | None, body: Any, namespace: str, labels: Any, **_: Any) -> None:
    """Learner StatefulSet changed: readiness into status; deleted: recreate."""
    _on_workload(C.ROLE_LEARNER, type, body, namespace, labels)


@kopf.on.event("kueue.x-k8s.io", "v1beta2", "workloads", labels=_OWNED)
def queue_event(type: str | None, body: Any, namespace: str, labels: Any, **_: Any) -> None:
    """Kueue admitted, evicted or finished a run's Workload (or it was deleted): re-converge the
    run, which scales it to what is admitted."""
    if labels.get(C.LABEL_RUN):
        repair(namespace, labels[C.LABEL_RUN], "queue")


@kopf.on.event("v1", "configmaps", labels=_OWNED)
@kopf.on.event("v1", "services", labels=_OWNED)
def simple_child_event(type: str | None, namespace: str, labels: Any, **_: Any) -> None:
    """A ConfigMap or Service was deleted behind our back: recreate it."""
    if type == "DELETED" and labels.get(C.LABEL_RUN):
        repair(namespace, labels[C.LABEL_RUN])


# Runs whose pods were last seen healthy: a healthy pod of such a run needs no status read.
_HEALTHY: set[tuple[str, str]] = set()


@kopf.on.event("v1", "pods", labels=_OWNED)
def pod_event(type: str | None, body: Any, namespace: str, labels: Any, **_: Any) -> None:
    """A pod of a run changed: Degraded while any pod of the run is failing (crash loop, image
    pull, no node fits), Failed once a role's restarts pass spec.failurePolicy.backoffLimit."""
    run = labels.get(C.LABEL_RUN)
    if not run:
        return
    if type == "DELETED" and labels.get(C.LABEL_ROLE) in B.QUEUED_ROLES:
        # A stopping run moves on once its pods are gone: the rollout replicas follow the last
        # learner, and a run Kueue evicted gives its reservation back.
        rl = kube.get_rlrun(namespace, run) or {}
        sp = rl.get("spec") or {}
        if sp.get("suspend") or (sp.get("scheduling") or {}).get("queueName"):
            repair(namespace, run, "drain")
    key = (namespace, run)
    pod = _plain(body)
    if key in _HEALTHY and not S.pod_problems(pod) and not any(S.restarts_by_role([pod]).values()):
        return
    check_health(namespace, run)


def check_health(namespace: str, run: str) -> None:
    pods = kube.list_pods(namespace, run)
    seen: dict[str, Any] = {}

    def mutate(rl: dict[str, Any], st: dict[str, Any]) -> dict[str, Any] | None:
        if S.finished(st) or S.is_true(st.get("conditions"), C.COND_INVALID):
            return None
        try:
            spec = parse_spec(rl.get("spec") or {})
        except SpecError:
            return None
        gen = int(rl["metadata"].get("generation") or 0)
        seen.update(before=S.condition(st.get("conditions"), C.COND_DEGRADED), rlrun=rl, spec=spec)
        conds = S.health_conditions(st.get("conditions"), pods, spec.failure_policy.backoff_limit, gen)
        st["conditions"] = conds
        st["phase"] = S.phase(conds, spec.suspend)
        return st

    written = kube.update_status(namespace, run, mutate)
    if written is None:
        if not [p for pod in pods for p in S.pod_problems(pod)]:
            _HEALTHY.add((namespace, run))
        return
    conds = written.get("conditions")
    degraded, failed = S.condition(conds, C.COND_DEGRADED), S.is_true(conds, C.COND_FAILED)
    if degraded and degraded.get("status") == "True":
        _HEALTHY.discard((namespace, run))
        before = seen.get("before") or {}
        if (before.get("status"), before.get("reason")) != ("True", degraded["reason"]):
            log.warning("%s/%s degraded: %s", namespace, run, degraded["message"])
            _event(seen["rlrun"], "Warning", degraded["reason"], degraded["message"])
    else:
        _HEALTHY.add((namespace, run))
    if failed:
        msg = S.condition(conds, C.COND_FAILED)["message"]
        log.warning("%s/%s failed: %s", namespace, run, msg)
        _event(seen["rlrun"], "Warning", "BackoffLimitExceeded", msg)
        body = seen["rlrun"]
        reconcile(namespace, run, body["metadata"]["uid"], body.get("spec") or {},
                  int(body["metadata"].get("generation") or 0), written, trigger="failed")


def _event(rlrun: dict[str, Any], type_: str, reason: str, message: str) -> None:
    try:
        kube.post_event(rlrun, type_, reason, message)
    except Exception as exc:  # an event is a courtesy; the condition already says it
        log.warning("posting event %s failed: %s", reason, exc)


def repair(namespace: str, run: str, trigger: str = "repair") -> None:
    """Re-converge one run after a child vanished or its admission changed (not when the run
    itself is going)."""
    body = kube.get_rlrun(namespace, run)
    if not body or body["metadata"].get("deletionTimestamp"):
        return
    try:
        reconcile(namespace, run, body["metadata"]["uid"], body.get("spec") or {},
                  int(body["metadata"].get("generation") or 0), body.get("status") or {}, trigger)
    except kopf.PermanentError:
        pass  # already reported as the Invalid condition


# ---------------------------------------------------------------- progress and drift


def _fold_progress(rl: dict[str, Any], st: dict[str, Any], raw: str, prog: dict[str, Any],
                   spec_m: RLRunSpec) -> dict[str, Any] | None:
    """The RLRun's status with the driver's report `prog` (the annotation `raw`) folded in:
    progress, TargetReached, Degraded on a failure report, the outcome conditions and phase.
    None when the report is stale (removed by a retry, or from before the run ended)."""
    gen = int(rl["metadata"].get("generation") or 0)
    # The report as it is now: kopf's copy may predate a retry that removed it.
    if (rl["metadata"].get("annotations") or {}).get(C.ANNOTATION_PROGRESS) != raw:
        return None
    if S.finished(st) and prog.get("failed"):
        return None  # a report from before the run ended changes nothing
    old = st.get("progress") or {}
    # A failure report may carry no figures: the last step's stay.
    merged = {**old, **prog} if prog.get("failed") else prog
    st["progress"] = S.progress_status(merged, st.get("plan") or {}, spec_m.target.value,
                                       spec_m.budget.max_samples)
    conds = st.get("conditions")
    if prog.get("failed") and prog.get("outcome") != C.COND_FAILED:
        conds = S.set_condition(conds, C.COND_DEGRADED, True, "DriverError",
                                f"the driver (learner rank 0) stopped: {prog.get('message', 'no message')}; "
                                "the pod restarts from the last checkpoint", gen)
    if prog.get("targetReached"):
        conds = S.set_condition(conds, C.COND_TARGET_REACHED, True, "TargetReached",
                                f"{spec_m.target.metric} reached {prog.get('targetMetric')} "
                                f"(target {spec_m.target.value})", gen)
    elif prog.get("targetMetric") is not None:
        conds = S.set_condition(conds, C.COND_TARGET_REACHED, False, "Training",
                                f"{spec_m.target.metric} = {prog.get('targetMetric')} "
                                f"(target {spec_m.target.value})", gen)
    conds = S.outcome_conditions(conds, prog, spec_m.target.metric, spec_m.target.value, gen)
    st["conditions"] = conds
    if not S.is_true(conds, C.COND_INVALID):
        st["phase"] = S.phase(conds, spec_m.suspend)
    return st


@kopf.timer(*_RLRUN, interval=PROGRESS_INTERVAL, initial_delay=PROGRESS_INTERVAL)
def progress_timer(name: str, namespace: str, uid: str, meta: Any, spec: Any, status: Any, **_: Any) -> None:
    """Fold the learner's progress report into status; re-plan when throughput drifts > 20%.
    A queued run that is not running what Kueue admitted is re-converged here too: Workload
    events cover it when Kueue's CRDs were there at the operator's start, this covers the rest."""
    if ((_plain(spec) or {}).get("scheduling") or {}).get("queueName") and Q.out_of_step(namespace, name,
                                                                                         _plain(status)):
        repair(namespace, name, "queue")
    raw = (meta.get("annotations") or {}).get(C.ANNOTATION_PROGRESS)
    prog, err = S.parse_progress(raw)
    if err:
        log.warning("%s/%s: %s", namespace, name, err)
    if not prog:
        return
    status = _plain(status)
    spec_d = _plain(spec)
    try:
        spec_m = parse_spec(spec_d)
    except SpecError:
        return

    was_finished = S.finished(status)
    try:
        written = kube.update_status(namespace, name, lambda rl, st: _fold_progress(rl, st, raw, prog, spec_m))
    except ApiException as exc:
        if exc.status in TRANSIENT_API_STATUS:  # kopf logs it and runs the timer again
            raise kopf.TemporaryError(f"status update: {exc.status} {exc.reason}", delay=PROGRESS_INTERVAL) from exc
        raise
    if prog.get("outcome") in C.OUTCOME_PHASES:
        if not was_finished and written is not None:
            # The run has ended: every workload (the Ray head too) to zero; status keeps the results.
            log.info("%s/%s: %s; scaling the run's workloads to zero", namespace, name, prog["outcome"])
            reconcile(namespace, name, uid, spec_d, int(meta.get("generation") or 0), written, trigger="finished")
        return
    if not (spec_m.suspend or prog.get("targetReached")):
        _replan_on_drift(namespace, name, uid, int(meta.get("generation") or 0), spec_d, status, prog)


def _replan_on_drift(namespace: str, name: str, uid: str, generation: int, spec_d: dict[str, Any],
                     status: dict[str, Any], prog: dict[str, Any]) -> None:
    """Re-plan with the measured throughput when it departs from the plan's by more than the
    threshold, once per departure (not again while it matches the last calibration)."""
    plan = status.get("plan") or {}
    measured = prog.get("samplesPerSecond")
    d = S.drift(plan, measured)
    calibrated = (status.get("calibration") or {}).get("samplesPerSecond")
    if (d is None or d <= C.DRIFT_THRESHOLD
            or (calibrated and abs(measured - calibrated) / calibrated <= C.DRIFT_THRESHOLD)):
        return
    predicted = plan.get("predicted") or {}
    # What was measured, and at which configuration (the planner rescales from there).
    calibration = {"samplesPerSecond": float(measured), "drift": round(d, 3),
                   "predictedSamplesPerSecond": predicted.get("samplesPerSecond"),
                   "predictedPhaseSeconds": predicted.get("phaseSeconds") or predicted.get("phases"),
                   **{k: plan.get(k) for k in ("prompts", "samplesPerPrompt", "rolloutReplicas",
                                               "learnerReplicas")}}
    for k in ("phaseSeconds", "noiseScale"):
        if k in prog:
            calibration[k] = prog[k]

    def keep_calibration(rl: dict[str, Any], st: dict[str, Any]) -> dict[str, Any]:
        st["calibration"] = calibration
        return st

    kube.update_status(namespace, name, keep_calibration)
    M.REPLANS.labels("drift").inc()
    log.info("%s/%s: measured %.1f samples/s vs planned %s (%.0f%% off): re-planning", namespace, name,
             measured, calibration["predictedSamplesPerSecond"], 100 * d)
    reconcile(namespace, name, uid, spec_d, generation, {**status, "calibration": calibration}, trigger="drift")
