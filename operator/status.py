"""Pure status logic: conditions, phase, progress and the run's pods' health, and the one function that
computes an RLRun's whole status from what a reconcile pass observed (compute_status)."""

from __future__ import annotations

import copy
import datetime as dt
import json
from typing import Any

from rlscale.plan.calibration import Calibration
from rlscale.plan.headline import known_samples_to_target
from rlscale.progress import fmt_duration  # one formatter for the CLI, the runner and status
from rlscale.progress_report import ProgressReport, export_words

from . import builders as B
from . import constants as C
from . import deadlines as D
from . import faults as F
from .guard import CLUSTER_REFUSALS
from .observed import Observed

# status.rayTokenSecret: the run's Ray token Secret, which this operator created (it cannot read
# Secrets back, so this is how a later pass knows an existing one is the run's own).
TOKEN_STATUS = "rayTokenSecret"
IMAGES_STATUS = "images"  # the default images the run keeps (builders.images_record)


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def set_condition(conditions: list[dict[str, Any]] | None, type_: str, status: bool | str, reason: str,
                  message: str, generation: int | None, now: str | None = None) -> list[dict[str, Any]]:
    """A new conditions list with type_ set; lastTransitionTime moves only when status flips."""
    st = status if isinstance(status, str) else ("True" if status else "False")
    out, found = [], False
    for c in conditions or []:
        if c.get("type") != type_:
            out.append(c)
            continue
        found = True
        changed = c.get("status") != st
        out.append({"type": type_, "status": st, "reason": reason, "message": message,
                    "lastTransitionTime": ((now or now_iso()) if changed
                                           else c.get("lastTransitionTime") or now or now_iso()),
                    "observedGeneration": generation})
    if not found:
        out.append({"type": type_, "status": st, "reason": reason, "message": message,
                    "lastTransitionTime": now or now_iso(), "observedGeneration": generation})
    order = {t: i for i, t in enumerate(C.CONDITION_TYPES)}
    return sorted(out, key=lambda c: order.get(c["type"], len(order)))


def condition(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def is_true(conditions: list[dict[str, Any]] | None, type_: str) -> bool:
    c = condition(conditions, type_)
    return bool(c and c.get("status") == "True")


def phase(conditions: list[dict[str, Any]] | None, suspended: bool) -> str:
    """The one-word phase the printer columns show, derived from the conditions."""
    if is_true(conditions, C.COND_INVALID) or is_true(conditions, C.COND_FAILED):
        return C.PHASE_FAILED
    if is_true(conditions, C.COND_SUCCEEDED) or is_true(conditions, C.COND_TARGET_REACHED):
        return C.PHASE_SUCCEEDED
    if is_true(conditions, C.COND_BUDGET_EXHAUSTED):
        return C.PHASE_BUDGET_EXHAUSTED
    if suspended:
        return C.PHASE_SUSPENDED
    admitted = condition(conditions, C.COND_ADMITTED)
    if admitted and admitted.get("status") == "False":
        return C.PHASE_QUEUED
    if is_true(conditions, C.COND_ROLLOUT_READY) and is_true(conditions, C.COND_LEARNERS_READY):
        return C.PHASE_RUNNING
    return C.PHASE_PENDING


def readiness(role: str, desired: int, ready: int, generation: int | None,
              conditions: list[dict[str, Any]] | None, now: str | None = None) -> list[dict[str, Any]]:
    """Set RolloutReady or LearnersReady from the workload's desired and ready replicas."""
    type_ = C.COND_ROLLOUT_READY if role == C.ROLE_ROLLOUT else C.COND_LEARNERS_READY
    what = "rollout replicas" if role == C.ROLE_ROLLOUT else "learner ranks"
    if desired == 0:
        return set_condition(conditions, type_, False, "ScaledToZero", f"0 {what} desired", generation, now)
    ok = ready >= desired
    return set_condition(conditions, type_, ok, "AllReady" if ok else "Waiting",
                         f"{ready}/{desired} {what} ready", generation, now)


def finished(status: dict[str, Any] | None) -> bool:
    """The run has ended (target reached, budget spent, or failed): its workloads stay at zero. A run
    the cluster refused (guard.CLUSTER_REFUSALS) is Failed until the cause is gone, not ended."""
    conds = (status or {}).get("conditions")
    return (any(is_true(conds, t) for t in (C.COND_SUCCEEDED, C.COND_BUDGET_EXHAUSTED))
            or (is_true(conds, C.COND_FAILED) and not refused_by_cluster(conds)))


def refused_by_cluster(conditions: list[dict[str, Any]] | None) -> str | None:
    """The reason of a Failed condition that the cluster's policy or objects set, else None."""
    failed = condition(conditions, C.COND_FAILED) or {}
    return failed["reason"] if failed.get("status") == "True" and failed.get("reason") in CLUSTER_REFUSALS else None


def outcome_conditions(conditions: list[dict[str, Any]] | None, progress: dict[str, Any], metric: str,
                       target: float, generation: int | None, now: str | None = None) -> list[dict[str, Any]]:
    """Succeeded or BudgetExhausted from the driver's last report, with the figures in words."""
    outcome = progress.get("outcome")
    if outcome not in C.OUTCOME_PHASES:
        return conditions or []
    samples = progress.get("samples")
    if outcome == C.COND_FAILED:
        msg = (f"the driver (learner rank 0) stopped at step {progress.get('step', 0)}: "
               f"{progress.get('message') or 'no message'}")
        return set_condition(conditions, outcome, True, "DriverFailed", msg + "; workloads scaled to zero",
                             generation, now)
    if outcome == C.COND_SUCCEEDED:
        ttt = progress.get("timeToTargetSeconds")
        msg = (f"{metric} reached {progress.get('targetMetric')} (target {target}) after "
               f"{progress.get('samplesToTarget', samples)} samples"
               + (f" in {fmt_duration(float(ttt))}" if ttt is not None else ""))
    else:
        msg = (f"budget spent at step {progress.get('step')} and {samples} samples with {metric} = "
               f"{progress.get('targetMetric')} (target {target})")
    if progress.get("report"):
        msg += f"; report in {progress['report']}"
    exported = export_words(progress.get("export"))  # spec.export.hf: where the model is, or why it is not
    if exported:
        msg += f"; {exported}"
    return set_condition(conditions, outcome, True, outcome, msg + "; workloads scaled to zero", generation, now)


def parse_progress(raw: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """The learner's progress annotation -> (report in wire form, error); keys this version does not
    know are dropped (ProgressReport.from_wire)."""
    if not raw:
        return None, None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        return None, (f"metadata.annotations[{C.ANNOTATION_PROGRESS}]: not JSON ({exc.msg}); "
                      "the learner writes a JSON object such as {\"step\": 3, \"samples\": 384}")
    if not isinstance(data, dict):
        return None, f"metadata.annotations[{C.ANNOTATION_PROGRESS}]: {data!r} is not a JSON object"
    try:
        report = ProgressReport.from_wire(data)
    except TypeError as exc:
        return None, f"metadata.annotations[{C.ANNOTATION_PROGRESS}]: {exc}"
    # An older driver may have written NaN (Python's json reads it; the API server would not): to_wire drops it.
    return report.to_wire(), None


def progress_status(progress: dict[str, Any], plan: dict[str, Any], target_value: float) -> dict[str, Any]:
    """status.progress: what the learner reported plus an ETA from the planned samples-to-target."""
    out = dict(progress)
    sps = float(progress.get("samplesPerSecond") or 0)
    if progress.get("targetReached"):
        out.setdefault("timeToTargetSeconds", progress.get("elapsedSeconds"))
        out["etaSeconds"] = 0
        if out.get("timeToTargetSeconds") is not None:
            out["timeToTarget"] = fmt_duration(float(out["timeToTargetSeconds"]))
        return out
    # The ETA counts down the plan's samples-to-target only where that was measured: a placeholder's
    # (rlscale/plan/headline.py) would publish a made-up time, so the status says unknown instead.
    stt = known_samples_to_target(plan)
    if stt is None:
        out.pop("etaSeconds", None)
        out["timeToTarget"] = "unknown"
        return out
    samples = float(progress.get("samples") or 0)
    if sps > 0:
        out["etaSeconds"] = round(max(stt - samples, 0.0) / sps, 1)
        out["timeToTarget"] = "eta " + fmt_duration(out["etaSeconds"])
    return out


# ---------------------------------------------------------------- the run's pods


def _tail(text: str | None, lines: int = 4, chars: int = 600) -> str:
    """The last lines of a container's termination message (its log tail, FallbackToLogsOnError)."""
    kept = [ln for ln in (text or "").strip().splitlines() if ln.strip()][-lines:]
    return " | ".join(kept)[-chars:]


def _container_statuses(pod_status: dict[str, Any]) -> list[dict[str, Any]]:
    """Init containers' statuses, then the containers'."""
    return [*(pod_status.get("initContainerStatuses") or []), *(pod_status.get("containerStatuses") or [])]


def pod_problems(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """What keeps one pod of the run from working, as {pod, role, reason, message}, worst first."""
    meta, st = pod.get("metadata") or {}, pod.get("status") or {}
    name, role = meta.get("name", "?"), (meta.get("labels") or {}).get(C.LABEL_ROLE, "?")
    out: list[dict[str, Any]] = []
    if meta.get("deletionTimestamp") or st.get("phase") == "Failed":
        # Going away on purpose (a scale-down, suspend, the end of the run), or ended by its node (an
        # eviction): the failure budget counts that (faults.disruption), its workload replaces it.
        return []
    for cs in _container_statuses(st):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        last = (cs.get("lastState") or {}).get("terminated") or {}
        now = (cs.get("state") or {}).get("terminated") or {}
        if now and now.get("exitCode") not in (0, None):
            # Exited with an error and about to be restarted (the first restarts come before
            # the kubelet reports CrashLoopBackOff).
            reason = "OOMKilled" if now.get("reason") == "OOMKilled" else "ExitedWithError"
            msg = (f"pod {name} container {cs.get('name')}: exited {now.get('exitCode')} ({now.get('reason', 'Error')})"
                   + (f" after {cs['restartCount']} restarts" if cs.get("restartCount") else ""))
            if _tail(now.get("message")):
                msg += f": {_tail(now.get('message'))}"
            out.append({"pod": name, "role": role, "reason": reason, "message": msg})
            continue
        if waiting.get("reason") not in C.BAD_WAITING:
            continue
        msg = f"pod {name} container {cs.get('name')}: {waiting['reason']}"
        if cs.get("restartCount"):
            msg += f" after {cs['restartCount']} restarts"
        if last:
            msg += f"; last exit {last.get('exitCode')} ({last.get('reason', 'Error')})"
            if _tail(last.get("message")):
                msg += f": {_tail(last.get('message'))}"
        elif waiting.get("message"):
            msg += f": {waiting['message'][:600]}"
        reason = "OOMKilled" if last.get("reason") == "OOMKilled" else waiting["reason"]
        out.append({"pod": name, "role": role, "reason": reason, "message": msg})
    for c in st.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            out.append({"pod": name, "role": role, "reason": "Unschedulable",
                        "message": f"pod {name} cannot be scheduled: {c.get('message', '')[:600]}"})
    return out


def restarts_by_role(pods: list[dict[str, Any]]) -> dict[str, int]:
    """Container restarts summed over each role's current pods."""
    out: dict[str, int] = {}
    for pod in pods:
        role = ((pod.get("metadata") or {}).get("labels") or {}).get(C.LABEL_ROLE, "?")
        st = pod.get("status") or {}
        n = sum(int(cs.get("restartCount") or 0)
                for cs in _container_statuses(st))
        out[role] = out.get(role, 0) + n
    return out


def last_exit(pods: list[dict[str, Any]], role: str) -> str:
    """The most recent termination of a role's containers, in words (for the Failed message)."""
    best: tuple[str, str] = ("", "")
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (meta.get("labels") or {}).get(C.LABEL_ROLE) != role:
            continue
        st = pod.get("status") or {}
        for cs in _container_statuses(st):
            t = (cs.get("lastState") or {}).get("terminated") or (cs.get("state") or {}).get("terminated")
            if t and (t.get("finishedAt") or "") >= best[0]:
                text = (f"pod {meta.get('name')} container {cs.get('name')} exited {t.get('exitCode')} "
                        f"({t.get('reason', 'Error')})")
                if _tail(t.get("message")):
                    text += f": {_tail(t.get('message'))}"
                best = (t.get("finishedAt") or "", text)
    return best[1]


def pod_signature(pod: dict[str, Any]) -> str:
    """What of one pod bears on the run's health: its problems and restarts. A pod event that leaves
    this as it was changes no condition (the pod's handler skips the pass)."""
    return json.dumps([pod_problems(pod), sum(restarts_by_role([pod]).values()), F.disruption(pod)], sort_keys=True)


HEALTHY_POD = json.dumps([[], 0, None])
# Failed reasons that the run's pods or its deadline set: each ends the run (and posts an Event).
POD_FAILURES = ("BackoffLimitExceeded", *D.REASONS)


def waiting_for_capacity(problems: list[dict[str, Any]], serving: tuple[int, int] | None) -> str | None:
    """Degraded's message when the only problems are rollout pods no node fits and the driver trains
    with fewer replicas than planned (`serving`: running, planned), else None."""
    if not problems or serving is None or serving[0] >= serving[1]:
        return None
    if any((p["role"], p["reason"]) != (C.ROLE_ROLLOUT, "Unschedulable") for p in problems):
        return None
    n = len(problems)
    return (f"the driver trains with {serving[0]} of {serving[1]} planned rollout replicas: {n} rollout "
            f"pod{'s' if n > 1 else ''} cannot be scheduled ({problems[0]['message']}); it takes each replica "
            "once Serve places it")


def health_conditions(conditions: list[dict[str, Any]] | None, pods: list[dict[str, Any]], backoff_limit: int,
                      generation: int | None, now: str | None = None, driver_error: str | None = None,
                      faults: dict[str, Any] | None = None,
                      serving: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """Degraded from the pods' current problems (WaitingForCapacity when they are rollout pods no node
    fits while the driver serves fewer than planned: `serving` is (running, planned)), else from the
    driver's error report (`driver_error`: it stopped and its pod restarts); Failed once the run's
    faults (status.faults, operator/faults.py) pass the limit."""
    problems = [p for pod in pods for p in pod_problems(pod)]
    restarts = restarts_by_role(pods)
    if F.exceeded(faults, backoff_limit):
        assert faults is not None
        msg = F.message(faults, backoff_limit)
        why = last_exit(pods, faults.get("lastRole", "?"))
        conditions = set_condition(conditions, C.COND_FAILED, True, "BackoffLimitExceeded",
                                   msg + (f"; last: {why}" if why else "") + "; workloads scaled to zero",
                                   generation, now)
        if not problems and not driver_error:
            return conditions  # Degraded stays as the pods last showed it
    capacity = waiting_for_capacity(problems, serving)
    if capacity:
        return set_condition(conditions, C.COND_DEGRADED, True, "WaitingForCapacity", capacity, generation, now)
    if problems:
        first = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return set_condition(conditions, C.COND_DEGRADED, True,
                             f"{first['role'].title().replace('-', '')}{first['reason']}",
                             first["message"] + more, generation, now)
    if driver_error:
        return set_condition(conditions, C.COND_DEGRADED, True, "DriverError",
                             f"the driver (learner rank 0) stopped: {driver_error}; "
                             "the pod restarts from the last checkpoint", generation, now)
    if condition(conditions, C.COND_DEGRADED) is not None or any(restarts.values()):
        return set_condition(conditions, C.COND_DEGRADED, False, "Healthy", "no pod of the run is failing",
                             generation, now)
    return conditions or []


# ---------------------------------------------------------------- the whole status of one pass


def compute_status(o: Observed, now: str | None = None) -> dict[str, Any]:
    """The RLRun's new status from one reconcile pass: the previous status moved on by what the pass
    read (the progress report, the pods, the workloads) and did (the plan, the children it applied),
    or by the refusal that stopped it. Pure: a pass that changed nothing gives the status it read, so
    nothing is written. A pass stopped by an error moves on only what it observed (progress, health,
    readiness seen before it applied anything); the plan part waits for a pass that completes."""
    now = now or now_iso()
    st = copy.deepcopy(o.status)
    gen = o.generation
    conds = st.get("conditions")
    if o.retried:
        conds = set_condition(conds, C.COND_FAILED, False, "SpecChanged",
                              f"spec changed (generation {gen}): retrying", gen, now)
        conds = set_condition(conds, C.COND_DEGRADED, False, "SpecChanged", "retrying", gen, now)
    _fold_images(st, o)
    if o.token:
        st[TOKEN_STATUS] = o.token
    elif o.token == "":  # the Secret of that name is another's
        st.pop(TOKEN_STATUS, None)
    if o.refusal is not None and o.refusal[0] in CLUSTER_REFUSALS:
        conds = set_condition(conds, C.COND_FAILED, True, *o.refusal, gen, now)
        st.update(conditions=conds, observedGeneration=gen, phase=C.PHASE_FAILED)
        return st
    if o.refusal is not None:
        reason, message = o.refusal
        conds = set_condition(conds, C.COND_INVALID, True, reason, message, gen, now)
        conds = set_condition(conds, C.COND_PLANNED, False, reason, "no plan for an invalid run", gen, now)
        st.update(conditions=conds, observedGeneration=gen, phase=C.PHASE_FAILED)
        return st
    if o.spec is None:  # the pass stopped before it had read the spec
        return st
    if o.done:
        conds = _fold_plan(st, o, conds, gen, now)
    if o.done and o.apply and refused_by_cluster(conds):  # every child applied: the cause is gone
        conds = set_condition(conds, C.COND_FAILED, False, "Resolved", "the run's children are applied", gen, now)
    conds = _fold_report(st, o, conds, gen, now)
    if not finished({"conditions": conds}) and not is_true(conds, C.COND_INVALID):
        rep = o.report or {}
        driver_error = (rep.get("message") or "no message") if rep.get("failed") and \
            rep.get("outcome") != C.COND_FAILED else None
        faults = o.faults if o.faults is not None else faults_after(o, now)
        if faults:
            st["faults"] = faults
        else:
            st.pop("faults", None)
        conds = health_conditions(conds, o.pods, o.spec.failure_policy.backoff_limit, gen, now, driver_error,
                                  faults, _serving(o))
        conds = _fold_deadlines(st, o, conds, gen, now)
    conds = _fold_readiness(st, o, conds, gen, now)
    if conds:
        st["conditions"] = conds
        st["phase"] = phase(conds, o.spec.suspend)
    return st


def _serving(o: Observed) -> tuple[int, int] | None:
    """(rollout replicas the driver's report says run, the plan's), when it says."""
    running = (o.report or {}).get("rolloutServing")
    if not isinstance(running, int) or o.plan is None:
        return None
    return running, o.plan.rollout_replicas


def _fold_images(st: dict[str, Any], o: Observed) -> None:
    """status.images: the default images the children were applied with, kept until a pass applies
    them again (with the same record, unless the spec named an image or the run was retried); a
    retried run's record goes, so the passes after it take the operator's current images."""
    if o.retried:
        st.pop(IMAGES_STATUS, None)
    if o.spec is None or o.images is None or not (o.applied or (o.done and o.apply)):
        return
    rec = B.images_record(o.spec, o.images)
    if rec:
        st[IMAGES_STATUS] = rec
    else:
        st.pop(IMAGES_STATUS, None)


def faults_after(o: Observed, now: str) -> dict[str, Any]:
    """status.faults moved on by this pass's pods and step (a retried run starts a new budget, from the
    restarts its pods have now)."""
    assert o.spec is not None
    prev = o.status.get("faults") or {}
    if o.retried:
        prev = {k: prev[k] for k in ("restarts", "uids") if k in prev}
    step = F.current_step(o.report, o.status.get("progress"))
    return F.advance(prev, o.pods, step, o.spec.checkpoint.every, now, gone=o.gone)


def deadlines_after(o: Observed, now: str) -> tuple[dict[str, Any], str | None, tuple[str, str] | None]:
    """status.waiting and status.startTime moved on by this pass, and the deadline found past (reason,
    message), if any (operator/deadlines.py). A run waiting for Kueue's admission has not started."""
    assert o.spec is not None
    conds = o.status.get("conditions")
    queued = bool(o.spec.scheduling.queue_name) and not is_true(conds, C.COND_ADMITTED)
    serving = (o.report or {}).get("rolloutServing")
    exempt = (C.ROLE_ROLLOUT,) if isinstance(serving, int) and serving > 0 else ()
    waiting = D.waiting_after(None if o.retried else o.status.get("waiting"), o.pods, now, exempt)
    start = D.start_time(o.status.get("startTime"), now, o.spec.suspend or queued, o.retried)
    ended = (D.deadline_past(start, now, o.spec.active_deadline_seconds)
             or D.stuck_past(waiting, o.pods, now, o.spec.failure_policy.pod_start_timeout_seconds))
    return waiting, start, ended


def _fold_deadlines(st: dict[str, Any], o: Observed, conds: list[dict[str, Any]] | None, gen: int,
                    now: str) -> list[dict[str, Any]] | None:
    """status.waiting and status.startTime, and Failed once a deadline is past (unless the run already failed)."""
    waiting, start, ended = (o.waiting, o.start_time, o.ended) if o.waiting is not None else deadlines_after(o, now)
    for key, value in (("waiting", waiting), ("startTime", start)):
        if value:
            st[key] = value
        else:
            st.pop(key, None)
    if ended is not None and not is_true(conds, C.COND_FAILED):
        conds = set_condition(conds, C.COND_FAILED, True, ended[0], ended[1] + "; workloads scaled to zero", gen, now)
    return conds


def _fold_plan(st: dict[str, Any], o: Observed, conds: list[dict[str, Any]] | None, gen: int,
               now: str) -> list[dict[str, Any]]:
    """The plan the children were built from, why, and the re-planner's gate and calibration."""
    assert o.plan is not None and o.spec is not None
    if o.admission is not None:
        conds = set_condition(conds, C.COND_ADMITTED, *o.admission, gen, now)
    conds = set_condition(conds, C.COND_INVALID, False, "Valid", "spec and plan are valid", gen, now)
    before = condition(conds, C.COND_PLANNED) or {}
    if o.planned:
        reason = "PlannedReplan" if o.planned == "replan" else f"Planned{o.planned.capitalize()}"
    else:  # the plan in status, kept (perhaps predicted anew): still planned for the same reason
        reason = before["reason"] if before.get("status") == "True" else f"Planned{o.trigger.capitalize()}"
    conds = set_condition(conds, C.COND_PLANNED, True, reason, o.plan.reason, gen, now)
    suspend = o.spec.suspend
    conds = set_condition(conds, C.COND_SUSPENDED, suspend, "SuspendRequested" if suspend else "Active",
                          "rollout and learners scaled to zero; config and checkpoints kept"
                          if suspend else "not suspended", gen, now)
    st["plan"] = o.plan.to_dict(candidates=False)
    if o.replan is not None:
        said = o.replan_message or (st.get("replan") or {}).get("message")
        st["replan"] = {**o.replan.to_dict(), **({"message": said} if said else {})}
    # What a switching re-plan calibrated from; older operators kept other figures here (a
    # throughput-drift record), which go.
    cal = Calibration.from_dict(o.calibration if o.calibration is not None else st.get("calibration"))
    if cal is None:
        st.pop("calibration", None)
    else:
        st["calibration"] = cal.to_dict()
    st["observedGeneration"] = gen
    return conds


def _fold_report(st: dict[str, Any], o: Observed, conds: list[dict[str, Any]] | None, gen: int,
                 now: str) -> list[dict[str, Any]] | None:
    """status.progress, TargetReached and the outcome from the driver's report (its measurements and
    rollout pods are inputs, not progress)."""
    if o.report is None:
        return conds
    assert o.spec is not None
    # The measurements and the rollout's pods are inputs of the re-planner and of ordered scaling.
    rep = {k: v for k, v in o.report.items() if k not in ("measurements", "rolloutPods")}
    target = o.spec.target
    # A failure report may carry no figures: the last step's stay.
    merged = {**(st.get("progress") or {}), **rep} if rep.get("failed") else rep
    st["progress"] = progress_status(merged, st.get("plan") or {}, target.value)
    if rep.get("targetReached"):
        conds = set_condition(conds, C.COND_TARGET_REACHED, True, "TargetReached",
                              f"{target.metric} reached {rep.get('targetMetric')} (target {target.value})", gen, now)
    elif rep.get("targetMetric") is not None:
        conds = set_condition(conds, C.COND_TARGET_REACHED, False, "Training",
                              f"{target.metric} = {rep.get('targetMetric')} (target {target.value})", gen, now)
    return outcome_conditions(conds, rep, target.metric, target.value, gen, now)


def _colocated_rollout_readiness(st: dict[str, Any], o: Observed, conds: list[dict[str, Any]] | None, gen: int,
                                 now: str) -> list[dict[str, Any]] | None:
    """Colocated, the engines live on the learner pods (no rollout Deployment): desired is one per
    learner pod the pass wants, ready what the driver last reported serving."""
    learners = (o.desired or {}).get(C.ROLE_LEARNER)
    if learners is None:
        learners = int(((o.workloads.get(C.ROLE_LEARNER) or {}).get("spec") or {}).get("replicas") or 0)
    desired = min(learners, o.plan.rollout_replicas) if o.plan is not None else learners
    ready = min(int((o.report or {}).get("rolloutServing") or 0), desired)
    st.setdefault("replicas", {})[C.ROLE_ROLLOUT] = {"desired": desired, "ready": ready}
    return readiness(C.ROLE_ROLLOUT, desired, ready, gen, conds, now)


def _fold_readiness(st: dict[str, Any], o: Observed, conds: list[dict[str, Any]] | None, gen: int,
                    now: str) -> list[dict[str, Any]] | None:
    """RolloutReady and LearnersReady, status.replicas: desired as this pass applied them (else as the
    workload has them), ready as the workload reports."""
    seen = st.get("replicas") or {}
    for role in (C.ROLE_ROLLOUT, C.ROLE_LEARNER):
        if role == C.ROLE_ROLLOUT and B.colocated(o.plan):
            conds = _colocated_rollout_readiness(st, o, conds, gen, now)
            continue
        # What this pass applied counts once the pass completed; an interrupted one shows what it found.
        w = o.workload(role) if o.done else o.workloads.get(role)
        if o.desired is not None and o.done:
            desired = o.desired[role]
        elif w is not None:
            desired = int((w.get("spec") or {}).get("replicas") or 0)
        elif role in seen:
            desired = int(seen[role].get("desired") or 0)
        else:
            continue
        ready = int(((w or {}).get("status") or {}).get("readyReplicas") or 0) if w is not None \
            else int((seen.get(role) or {}).get("ready") or 0)
        conds = readiness(role, desired, ready, gen, conds, now)
        st.setdefault("replicas", {})[role] = {"desired": desired, "ready": ready}
    return conds
