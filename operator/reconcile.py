"""One reconcile pass over one RLRun, whatever started it: an ordered chain of steps that reads the run
and decides what should exist (spec, retry, progress, plan and re-plan, token, queue, children) and
applies it, then the one status function (status.compute_status) over what the pass observed, then one
status write if it changed, guarded by the RLRun's resourceVersion (a conflict runs the pass again on
the RLRun as it is now). Every kopf handler (operator/handlers.py) funnels into Controller.reconcile."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import MutableMapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from rlscale.plan import Plan
from rlscale.plan.replan import Limits, Measurements, ReplanState, due, replan
from rlscale.spec import SpecError, parse_spec

from . import builders as B
from . import constants as C
from . import faults as F
from . import guard as G
from . import metrics as M
from . import policy as P
from . import profiles as PR
from . import queueing as Q
from . import scaling as SC
from . import status as S
from .egress import ApiServerEndpoints
from .finite import finite_only, nonfinite
from .kube import KubeAPI, NamespaceTerminating, get_rlrun
from .observed import ApiObserver, Observed, Observer
from .planning import PlanError, plan_for
from .settings import OperatorSettings

log = logging.getLogger("rlscale.operator")

# Triggers that (re)apply every child: the spec was created, changed or seen at start-up, a child
# vanished, Kueue's admission changed, or a stopping run's learner pods are gone. Other passes (the
# progress timer, pod and workload events) apply only when what the children are built from moved.
APPLY_TRIGGERS = frozenset({"create", "update", "resume", "repair", "queue", "drain"})
WRITE_ATTEMPTS = 8  # passes against a conflicting status write before giving up to kopf's retry
TOKEN_MEMO = "ray_token"  # in the RLRun's kopf memo: its Ray token Secret exists
# A child the API server refuses (4xx other than 409 and 429) is applied again after this many
# seconds, doubling per refusal of the same generation up to the cap.
REFUSED_BACKOFF_S, REFUSED_BACKOFF_CAP_S = 10.0, 300.0
# Answers that say "try again" rather than "no": the pass raises them, and kopf retries.
RETRYABLE_STATUS = (409, 429)


@dataclasses.dataclass
class Backoff:
    """A run whose children the API server refused: when to apply them again, and what it said."""

    generation: int
    attempts: int
    until: float  # time.monotonic()
    refusal: tuple[str, str]


class Controller:
    """The reconcile logic, over a KubeAPI (the API server, or the tests' in-memory fake)."""

    def __init__(self, api: KubeAPI, settings: OperatorSettings):
        self.api = api
        self.settings = settings
        self.clock = time.monotonic
        # By (namespace, run, uid): the children checked absent or the run's own and since applied;
        # a repair pass (a child deleted) checks again.
        self._owned: dict[tuple[str, str, str], frozenset[tuple[str, str, str]]] = {}
        # (namespace, run, uid): runs whose Ray token Secret this process created
        self._tokens: set[tuple[str, str, str]] = set()
        self._backoff: dict[tuple[str, str], Backoff] = {}
        # (namespace, run, uid) -> since when (self.clock()) its rollout Deployment is kept above the
        # plan's count while the driver drains (operator/scaling.py)
        self._holds: dict[tuple[str, str, str], float] = {}
        # One pass per run at a time: kopf runs the handlers of one run (its timer, its children's events)
        # in a thread pool, and two passes at once would apply children from two different reads.
        self._passes: dict[tuple[str, str], threading.Lock] = {}
        self._passes_lock = threading.Lock()
        self._api_server = ApiServerEndpoints(api, lambda: self.clock())  # the runs' egress

    def _pass_lock(self, namespace: str, name: str) -> threading.Lock:
        with self._passes_lock:
            return self._passes.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        """Drop what the controller remembers of a deleted run."""
        self._backoff.pop((namespace, name), None)
        with self._passes_lock:
            self._passes.pop((namespace, name), None)
        for memory in (self._owned, self._holds):
            for key in [k for k in memory if k[:2] == (namespace, name)]:
                del memory[key]
        self._tokens = {t for t in self._tokens if t[:2] != (namespace, name)}

    def reconcile(self, namespace: str, name: str, trigger: str, *, body: dict[str, Any] | None = None,
                  observer: Observer | None = None,
                  memo: MutableMapping[str, Any] | None = None,
                  gone: list[dict[str, Any]] | tuple = ()) -> Observed | None:
        """One pass; returns it, or None when the run is gone or going. `body`: the RLRun as the
        caller already has it (kopf's), read afresh otherwise. `memo`: the RLRun's kopf memo, when the
        caller is one of its handlers. `gone`: pods of the run deleted since, disrupted (their
        DELETED event: the watch's indexes no longer hold them). A step's error is raised once status
        has taken in what the pass observed.

        A status write that meets a newer RLRun (409) is made again on it: the status alone computed
        anew when what the steps decided from does not differ (another pass wrote readiness, say),
        else the whole pass again. Passes over one run take turns (the second reads the run anew)."""
        lock = self._pass_lock(namespace, name)
        if not lock.acquire(blocking=False):
            lock.acquire()
            body = None  # read before the other pass wrote: stale
        try:
            return self._reconcile(namespace, name, trigger, body, observer, memo, list(gone))
        finally:
            lock.release()

    def _reconcile(self, namespace: str, name: str, trigger: str, body: dict[str, Any] | None,
                   observer: Observer | None, memo: MutableMapping[str, Any] | None,
                   gone: list[dict[str, Any]]) -> Observed | None:
        t0 = time.monotonic()
        observer = observer or ApiObserver(self.api)
        o: Observed | None = None
        try:
            for attempt in range(WRITE_ATTEMPTS):
                rlrun = body if attempt == 0 and body is not None else get_rlrun(self.api, namespace, name)
                if rlrun is None or rlrun["metadata"].get("deletionTimestamp"):
                    return None
                if o is not None and _decided_from(o.rlrun) == _decided_from(rlrun):
                    o = dataclasses.replace(o, rlrun=rlrun)
                else:
                    o = self.run_pass(rlrun, trigger, observer, memo, gone)
                try:
                    new = self._write(o)
                except ApiException as exc:
                    if exc.status == 409 and attempt + 1 < WRITE_ATTEMPTS:
                        time.sleep(0.05 * (attempt + 1))
                        continue
                    if exc.status == 404:
                        return None
                    raise
                self._after(o, new)
                if o.error is not None:
                    raise o.error
                M.RECONCILES.labels("invalid" if o.refusal else "ok").inc()
                return o
            return None
        except NamespaceTerminating:
            # The run goes with its namespace; retrying would only fail again.
            M.RECONCILES.labels("skipped").inc()
            return None
        except Exception as exc:
            M.RECONCILES.labels("error").inc()
            M.ERRORS.labels(type(exc).__name__).inc()
            raise
        finally:
            M.RECONCILE_SECONDS.observe(time.monotonic() - t0)

    def run_pass(self, rlrun: dict[str, Any], trigger: str, observer: Observer,
                 memo: MutableMapping[str, Any] | None = None, gone: list[dict[str, Any]] | None = None) -> Observed:
        """The chain of steps over one RLRun; each fills in the Observed, a refusal ends it."""
        meta = rlrun["metadata"]
        o = Observed(rlrun=rlrun, trigger=trigger, pods=observer.pods(meta["namespace"], meta["name"]),
                     workloads=observer.workloads(meta["namespace"], meta["name"]), gone=list(gone or []))
        steps = (self._spec, self._retry, self._images, self._report, self._policy, self._plan, self._replan,
                 self._decide_apply, self._guard, lambda o: self._token(o, memo), self._queue, self._children)
        try:
            for step in steps:
                step(o)
                if o.refusal is not None:
                    return o
            o.done = True
        except NamespaceTerminating:
            raise
        except Exception as exc:  # status still takes in what was observed; then it is raised
            o.error = exc
        return o

    # ------------------------------------------------------------ the steps, in order

    def _spec(self, o: Observed) -> None:
        try:
            o.spec = parse_spec(o.rlrun.get("spec") or {})
        except SpecError as exc:
            o.refusal = ("SpecInvalid", str(exc))

    def _retry(self, o: Observed) -> None:
        """A Failed run whose spec changed since it failed gets another go (a fixed reward, a new image)."""
        failed = S.condition(o.status.get("conditions"), C.COND_FAILED)
        if not failed or failed.get("status") != "True" or int(failed.get("observedGeneration") or 0) >= o.generation:
            return
        if failed.get("reason") in G.CLUSTER_REFUSALS:  # not ended: every pass checks its cause again
            return
        # The failed driver's last report would fail the retried run again.
        self.api.remove_annotation(o.namespace, o.name, C.ANNOTATION_PROGRESS)
        (o.rlrun["metadata"].get("annotations") or {}).pop(C.ANNOTATION_PROGRESS, None)
        o.retried = True

    def _images(self, o: Observed) -> None:
        """The default images the run keeps (status.images) over the operator's current ones, so an
        upgrade with new run images leaves it be; a retried run takes the current ones."""
        images = B.run_images(self.settings.children, None if o.retried else o.status.get(S.IMAGES_STATUS))
        o.images = dataclasses.replace(images, api_server=self._api_server()) if images.egress != "open" else images

    def _report(self, o: Observed) -> None:
        """The driver's progress report; whether the run has ended (before, by the report, by its
        faults past the backoff limit: operator/faults.py, or past a deadline: operator/deadlines.py)."""
        assert o.spec is not None
        raw = (o.rlrun["metadata"].get("annotations") or {}).get(C.ANNOTATION_PROGRESS)
        report, err = S.parse_progress(raw)
        if err:
            log.warning("%s/%s: %s", o.namespace, o.name, err)
        ended_before = S.finished(o.status) and not o.retried
        # A failure report from before the run ended changes nothing.
        o.report = None if report and ended_before and report.get("failed") else report
        if not ended_before:  # the failure budget and the deadlines, moved on once in the pass
            now = S.now_iso()
            o.faults = S.faults_after(o, now)
            o.waiting, o.start_time, o.ended = S.deadlines_after(o, now)
        o.finished = (ended_before or (o.report or {}).get("outcome") in C.OUTCOME_PHASES
                      or (not S.is_true(o.status.get("conditions"), C.COND_INVALID)
                          and (F.exceeded(o.faults, o.spec.failure_policy.backoff_limit) or o.ended is not None)))

    def _policy(self, o: Observed) -> None:
        """The cluster admin's allowlists (chart values `policy.*`): a run outside them gets nothing. A run
        naming a placement profile the cluster lacks is Invalid; its pods are built from the spec with its
        profile's placement (operator/profiles.py), which the allowlists, meant for the run's own, do not see."""
        assert o.spec is not None
        profiles = self.settings.policy.placement_profiles
        if not o.finished:  # else its workloads are at zero: no pod runs what it asks for
            if msg := PR.unknown(o.spec, profiles):
                o.refusal = (PR.UNKNOWN_PROFILE, msg)
                return
            assert o.images is not None
            msg = P.refusal(o.spec, G.images(o.spec, o.images), self.settings.policy,
                            G.labels_reader(self.api, o.namespace))
            if msg:
                o.refusal = (G.NOT_ALLOWED, msg)
                return
        o.spec = PR.effective(o.spec, profiles)

    def _plan(self, o: Observed) -> None:
        """The plan in status, unless the spec changed since it was made (or there is none): then a
        new one, calibrated from status.calibration, with the run's learner count kept."""
        assert o.spec is not None
        st = o.status
        old = st.get("plan") or {}
        planned = S.condition(st.get("conditions"), C.COND_PLANNED) or {}
        # Planned is True at the generation its plan was made or kept for (False once refused).
        if old and planned.get("status") == "True" and planned.get("observedGeneration") == o.generation:
            try:
                o.plan = Plan.from_dict(old)
                return
            except (KeyError, TypeError, ValueError) as exc:  # a status no version of this code wrote
                log.warning("%s/%s: status.plan unreadable (%s); planning anew", o.namespace, o.name, exc)
        try:
            # A running run keeps its placement unless the spec names another (moving the engines
            # restarts every pod).
            keep = old.get("placement") if old.get("learnerReplicas") and o.spec.placement == "auto" else None
            o.plan = plan_for(o.spec, st.get("calibration"), learners=old.get("learnerReplicas"), placement=keep)
        except PlanError as exc:
            o.refusal = ("PlanFailed", str(exc))
            return
        except Exception as exc:  # a spec the planner cannot take: ended, not retried (it would fail again)
            log.exception("%s/%s: the planner failed", o.namespace, o.name)
            o.refusal = ("PlanFailed", planner_failure(f"failed with {type(exc).__name__}"))
            return
        if bad := nonfinite(o.plan.to_dict()):
            o.plan, o.refusal = None, ("PlanFailed", planner_failure("made a plan with non-finite "
                                                                     + ", ".join(bad[:3])))
            return
        o.planned = o.trigger
        if st.get("replan"):  # a proposal made for the old spec does not count for the new one
            o.replan = ReplanState(ReplanState.from_dict(st["replan"]).last_step)

    def _replan(self, o: Observed) -> None:
        """rlscale.plan.replan on the report's measurements, as the driver runs it on one machine."""
        rep = o.report or {}
        assert o.spec is not None and o.plan is not None
        if (o.finished or o.spec.suspend or not rep.get("measurements") or rep.get("failed")
                or rep.get("targetReached")):
            return
        try:
            m = Measurements.from_dict(rep["measurements"])
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("%s/%s: progress measurements unreadable: %s", o.namespace, o.name, exc)
            return
        state = o.replan or ReplanState.from_dict(o.status.get("replan"))
        limits = self._admitted_limits(o) if o.spec.scheduling.queue_name and due(m.step, state) else None
        try:
            d = replan(o.spec, o.plan, m, state, limits)
        except (ArithmeticError, KeyError, TypeError, ValueError) as exc:  # the report is the driver's word
            log.warning("%s/%s: no re-plan from these measurements (%s)", o.namespace, o.name, type(exc).__name__)
            return
        if d is None or nonfinite(d.plan.to_dict()):
            return
        o.plan, o.replan, o.replan_message = d.plan, d.state, d.message
        if d.switched:
            o.planned = "replan"
            o.calibration = m.calibration.to_dict()

    def _admitted_limits(self, o: Observed) -> Limits | None:
        """A queued run's re-plan asks for no more pods than Kueue admitted (an admitted Workload's pod
        sets do not change: operator/queueing.py); None while nothing is admitted (its pod sets still
        follow the plan)."""
        admitted = B.admitted_counts(self.api.get(C.KUEUE_API, "Workload", o.namespace,
                                                  B.names(o.name)[C.ROLE_QUEUE]))
        if not any(admitted.values()):
            return None
        # Colocated, the engines are the learner pods (no rollout pod set is queued).
        rollout = admitted[C.ROLE_LEARNER] if B.colocated(o.plan) else admitted[C.ROLE_ROLLOUT]
        return Limits(rollout=rollout, learners=admitted[C.ROLE_LEARNER])

    def _decide_apply(self, o: Observed) -> None:
        """Whether this pass applies the children: asked by its trigger, or what they are built from
        moved (the plan, the end of the run), or the workloads do not show the plan or the end."""
        assert o.plan is not None and o.spec is not None
        o.apply = (o.trigger in APPLY_TRIGGERS or o.status.get("plan") != o.plan.to_dict(candidates=False)
                   or o.finished != S.finished(o.status) or bool(S.refused_by_cluster(o.status.get("conditions")))
                   or self._out_of_step(o))

    def _out_of_step(self, o: Observed) -> bool:
        assert o.plan is not None and o.spec is not None
        want = B.plan_hash(o.plan)
        roles = (C.ROLE_LEARNER,) if B.colocated(o.plan) else (C.ROLE_ROLLOUT, C.ROLE_LEARNER)
        if B.colocated(o.plan) and self._leftover_rollout(o):
            return True
        for role in roles:
            w = o.workloads.get(role)
            if w is None or (w["metadata"].get("annotations") or {}).get(C.ANNOTATION_PLAN_HASH) != want:
                return True
        if o.finished and any(int((w.get("spec") or {}).get("replicas") or 0) for w in o.workloads.values()):
            return True
        # A rollout Deployment kept above the plan while the driver drains: each pass looks again.
        rollout = (o.workloads.get(C.ROLE_ROLLOUT) or {}).get("spec") or {}
        if not o.finished and not o.spec.suspend and int(rollout.get("replicas") or 0) > o.plan.rollout_replicas:
            return True
        # A queued run not running what Kueue admitted: Workload events cover it when Kueue's CRDs were
        # there at the operator's start, the progress timer covers the rest.
        return (o.trigger == "progress" and bool(o.spec.scheduling.queue_name)
                and Q.out_of_step(self.api, o.namespace, o.name, o.status))

    def _guard(self, o: Observed) -> None:
        """Before anything is applied: a run the API server refused waits out its backoff; its
        namespace must enforce Pod Security (unless the chart says otherwise); and no child it would
        apply may exist under another owner (applying with force would take it over)."""
        if not o.apply:
            return
        b = self._backoff.get((o.namespace, o.name))
        if b is not None and b.generation == o.generation and self.clock() < b.until:
            o.apply, o.refusal = False, b.refusal
            return
        if self.settings.require_pod_security and not o.finished:
            msg = G.namespace_refusal(o.namespace, self.api.get("v1", "Namespace", "", o.namespace))
            if msg:
                o.refusal = (G.NAMESPACE_NOT_ENFORCED, msg)
                return
        assert o.spec is not None and o.plan is not None
        # A colocated plan needs no check of its image: the default trainer image runs vLLM too, and
        # a spec.learner.image of the run's own must (docs/operations.md, "Colocated rollout").
        run = o.run_ref()
        children = B.build_children(run, o.spec, o.plan, o.images)
        if o.spec.scheduling.queue_name:
            children.append(B.build_workload(run, o.spec, o.plan, children))
        want = frozenset((m["apiVersion"], m["kind"], m["metadata"]["name"]) for m in children)
        known = frozenset() if o.trigger == "repair" else self._owned.get((o.namespace, o.name, run.uid), frozenset())
        for api_version, kind, name in sorted(want - known):
            have = self.api.get(api_version, kind, o.namespace, name)
            if have is not None and not G.owned_by(have, run.uid):
                o.refusal = (G.NAME_COLLISION, G.collision_message(kind, o.namespace, name, o.name))
                return
        o.owned = want

    def _token(self, o: Observed, memo: MutableMapping[str, Any] | None) -> None:
        """Create the run's Ray token Secret once; an existing one is kept (its pods hold it) when it
        is the run's own: status.rayTokenSecret names it (or this process created it). The operator
        may not read Secrets, so the first pass writes that name into status before it creates the
        Secret (a crash between the two leaves a record, not a Secret it cannot tell from another's),
        and a Secret already there then is someone else's: a name collision. The RLRun's memo
        remembers it; a pass from a child's event has no such memo and asks again (409)."""
        if not o.apply or (memo is not None and memo.get(TOKEN_MEMO)):
            return
        secret = B.build_ray_token_secret(o.run_ref(), B.new_ray_token())
        name, key = secret["metadata"]["name"], (o.namespace, o.name, o.rlrun["metadata"]["uid"])
        # A run an older operator planned (status.plan) got its Secret before its first plan was written.
        ours = key in self._tokens or o.status.get(S.TOKEN_STATUS) == name or \
            (bool(o.status.get("plan")) and S.TOKEN_STATUS not in o.status)
        if not ours:
            o.rlrun = self.api.merge_patch(o.rlrun, {"status": {S.TOKEN_STATUS: name}}, status=True)
        created = self.api.create_if_absent(secret)
        if not ours and not created:
            o.token = ""  # not the run's: status forgets the name again
            o.refusal = (G.NAME_COLLISION, G.collision_message("Secret", o.namespace, name, o.name))
            return
        if created:
            log.info("%s/%s: created the run's Ray token Secret", o.namespace, o.name)
        self._tokens.add(key)
        o.token = name
        if memo is not None:
            memo[TOKEN_MEMO] = True

    def _queue(self, o: Observed) -> None:
        """A queued run waits for Kueue to admit it whole; until then, and after an eviction, its
        workloads stay at zero (the ConfigMap, Services and checkpoints stay)."""
        assert o.spec is not None and o.plan is not None
        if o.apply and o.spec.scheduling.queue_name:
            o.admitted, o.admission = Q.sync_workload(self.api, o.run_ref(), o.spec, o.plan,
                                                      o.images or self.settings.children, o.finished, o.pods)

    def _children(self, o: Observed) -> None:
        """Server-side apply of every child (an unchanged one is not written)."""
        assert o.spec is not None and o.plan is not None
        if not o.apply:
            return
        run, spec = o.run_ref(), o.spec
        desired = B.desired_replicas(spec, o.plan, False, o.admitted)
        draining = SC.stopping(o.pods, o.workloads, S.now_iso()) if o.finished else self._draining(o, desired)
        if draining is None and not o.finished:
            draining = self._ordered(o, desired[C.ROLE_ROLLOUT])
        for manifest in B.build_children(run, spec, o.plan, o.images, finished=o.finished,
                                         admitted=o.admitted, draining=draining):
            try:
                applied = self.api.apply(manifest)
            except ApiException as exc:
                o.refusal = self._refused(o, manifest, exc)
                return
            if manifest["kind"] in ("Deployment", "StatefulSet"):
                o.applied[manifest["metadata"]["labels"][C.LABEL_ROLE]] = applied
            if self.settings.step_delay:
                time.sleep(self.settings.step_delay)
        if B.colocated(o.plan) and self._leftover_rollout(o):
            # A rollout Deployment from a disaggregated plan (spec.placement changed): colocated, the
            # engines run on the learner pods, so it goes to zero (it is not deleted: its pods drain).
            self.api.merge_patch(o.workloads[C.ROLE_ROLLOUT], {"spec": {"replicas": 0}})
        o.desired = B.desired_replicas(spec, o.plan, o.finished, o.admitted, draining)
        self._backoff.pop((o.namespace, o.name), None)
        key = (o.namespace, o.name, run.uid)
        self._owned[key] = self._owned.get(key, frozenset()) | o.owned

    @staticmethod
    def _leftover_rollout(o: Observed) -> bool:
        w = o.workloads.get(C.ROLE_ROLLOUT)
        return w is not None and int((w.get("spec") or {}).get("replicas") or 0) > 0

    def _refused(self, o: Observed, manifest: dict[str, Any], exc: ApiException) -> tuple[str, str]:
        """What a child's refused apply means for the run: a missing PodGroup API, or (another 4xx
        but 409 and 429) a refusal its status shows, applied again after a growing pause. Anything
        else is raised (kopf retries)."""
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        if exc.status == 404 and kind == "PodGroup":
            return ("PodGroupUnavailable",
                    f"spec.scheduling.podGroup is true, but this cluster serves no {C.POD_GROUP_API} "
                    "PodGroups: install scheduler-plugins' Coscheduling (its PodGroup CRD and a scheduler "
                    "that runs the plugin), or set podGroup to false")
        if not (400 <= int(exc.status or 0) < 500) or exc.status in RETRYABLE_STATUS:
            raise exc
        b = self._backoff.get((o.namespace, o.name))
        attempts = b.attempts + 1 if b is not None and b.generation == o.generation else 1
        delay = min(REFUSED_BACKOFF_S * 2 ** (attempts - 1), REFUSED_BACKOFF_CAP_S)
        refusal = (G.APPLY_REFUSED,
                   f"the API server refused {kind} {o.namespace}/{name} ({exc.status} {exc.reason}): "
                   f"{_server_message(exc)}; the operator applies it again after a pause that doubles up to "
                   f"{REFUSED_BACKOFF_CAP_S:.0f} s, or at once when the spec changes")
        self._backoff[(o.namespace, o.name)] = Backoff(o.generation, attempts, self.clock() + delay, refusal)
        return refusal

    def _draining(self, o: Observed, desired: dict[str, int]) -> int | None:
        """The rollout replicas to keep while the learners are told to stop (suspend, eviction) and
        some learner pod is still there; None when there is nothing to wait for."""
        if desired[C.ROLE_LEARNER] > 0:
            return None
        if not any(p["metadata"]["labels"].get(C.LABEL_ROLE) == C.ROLE_LEARNER for p in o.pods):
            return None
        return int(((o.workloads.get(C.ROLE_ROLLOUT) or {}).get("spec") or {}).get("replicas") or 0)

    def _ordered(self, o: Observed, planned: int) -> int | None:
        """Ordered scaling of the rollout (operator/scaling.py): the count to keep while the driver
        drains, else None after marking the pods whose replicas are gone, before the apply lowers
        the Deployment. A hold past SC.HOLD_LIMIT_S gives way."""
        w = o.workloads.get(C.ROLE_ROLLOUT)
        current = int((w.get("spec") or {}).get("replicas") or 0) if w is not None else None
        scale = SC.ordered_rollout(planned, current, o.report, o.pods, o.name)
        key = (o.namespace, o.name, o.rlrun["metadata"]["uid"])
        if scale.hold is not None:
            since = self._holds.get(key)
            if since is None:
                self._holds[key] = since = self.clock()
                log.info("%s/%s: %s", o.namespace, o.name, scale.message)
            if self.clock() - since < SC.HOLD_LIMIT_S:
                return scale.hold
            log.warning("%s/%s: the driver did not drain the rollout to %d replicas in %.0f s; lowering it now",
                        o.namespace, o.name, planned, SC.HOLD_LIMIT_S)
        self._holds.pop(key, None)
        SC.mark_pods(self.api, o.namespace, scale.release, scale.keep)
        return None

    # ------------------------------------------------------------ the write, and what follows it

    def _write(self, o: Observed) -> dict[str, Any] | None:
        """The status the pass computed, written if it changed; None when nothing was written."""
        new = S.compute_status(o)
        if bad := nonfinite(new):  # what the API server cannot store is left out, not retried for ever
            log.warning("%s/%s: status leaves out non-finite %s", o.namespace, o.name, ", ".join(bad[:5]))
            new = finite_only(new)
        if new == o.status:
            return None
        self.api.update_status(o.rlrun, new)
        return new

    def _after(self, o: Observed, new: dict[str, Any] | None) -> None:
        """Events and metrics for what the written status says that the previous one did not."""
        if new is not None:
            before, after = o.status.get("conditions"), new.get("conditions")
            self._announce(o, before, after)
            if S.finished(new) and not S.finished(o.status):
                log.info("%s/%s: the run has ended; its workloads go to zero", o.namespace, o.name)
        if o.planned == "replan" and new is not None:  # once: a pass that lost its write made it again
            log.info("%s/%s: %s", o.namespace, o.name, o.replan_message)
            M.REPLANS.labels("replan").inc()
        M.record_status(o.namespace, o.name, new if new is not None else o.status)
        if o.done and o.plan is not None:
            _record_metrics(o.namespace, o.name, o.plan, new if new is not None else o.status)

    def _announce(self, o: Observed, before: Any, after: Any) -> None:
        degraded, was = S.condition(after, C.COND_DEGRADED) or {}, S.condition(before, C.COND_DEGRADED) or {}
        if degraded.get("status") == "True" and (was.get("status"), was.get("reason")) != ("True", degraded["reason"]):
            log.warning("%s/%s degraded: %s", o.namespace, o.name, degraded["message"])
            self._event(o.rlrun, "Warning", degraded["reason"], degraded["message"])
        failed, was = S.condition(after, C.COND_FAILED) or {}, S.condition(before, C.COND_FAILED) or {}
        if (failed.get("status") == "True" and failed.get("reason") in S.POD_FAILURES
                and not S.is_true(before, C.COND_FAILED)):
            log.warning("%s/%s failed: %s", o.namespace, o.name, failed["message"])
            self._event(o.rlrun, "Warning", failed["reason"], failed["message"])
        elif (o.faults and o.faults.get("lastCause") and F.count(o.faults) > F.count(o.status.get("faults"))
              and o.spec is not None):
            # A pod ended from outside, counted under the limit (no Degraded says it: the pod is gone).
            msg = F.counted(o.faults, o.spec.failure_policy.backoff_limit)
            log.warning("%s/%s: %s", o.namespace, o.name, msg)
            self._event(o.rlrun, "Warning", "FaultCounted", msg)
        # One Event per distinct refusal, not per pass that meets it again.
        if S.refused_by_cluster(after) and (was.get("status"), was.get("reason"), was.get("message")) != \
                ("True", failed["reason"], failed["message"]):
            log.warning("%s/%s refused: %s", o.namespace, o.name, failed["message"])
            self._event(o.rlrun, "Warning", failed["reason"], failed["message"])

    def _event(self, rlrun: dict[str, Any], type_: str, reason: str, message: str) -> None:
        try:
            self.api.post_event(rlrun, type_, reason, message)
        except Exception as exc:  # an event is a courtesy; the condition already says it
            log.warning("posting event %s failed: %s", reason, exc)


# Conditions a pass's steps read from the previous status (besides its plan, gate and calibration).
_DECIDING_CONDITIONS = (C.COND_PLANNED, C.COND_INVALID, C.COND_FAILED, C.COND_SUCCEEDED, C.COND_BUDGET_EXHAUSTED,
                        C.COND_ADMITTED)


def planner_failure(what: str) -> str:
    """The PlanFailed message for a planner that did not raise a PlanError of its own: the figures of the
    spec it plans from, to look at."""
    return (f"the planner {what} on this spec: a figure it plans from is out of the range it can take; check "
            "spec.hardware (memoryBandwidth, peakFlops, memory, interconnectBandwidth), spec.model.shape, "
            "spec.optimizer.noiseScale and spec.target.expectedSamples, or report the spec as a planner bug")


def _decided_from(rlrun: dict[str, Any]) -> tuple:
    """What of an RLRun a pass's steps decide from: its spec (generation), the driver's report, and
    the parts of status that say which plan holds, which images the run keeps, whether the run has
    ended and what Kueue admitted.
    Readiness, health and progress, which every pass computes anew, are not among them."""
    meta, st = rlrun["metadata"], rlrun.get("status") or {}
    conds = [(c.get("type"), c.get("status"), c.get("reason"), c.get("observedGeneration"))
             for c in st.get("conditions") or [] if c.get("type") in _DECIDING_CONDITIONS]
    return (meta.get("generation"), (meta.get("annotations") or {}).get(C.ANNOTATION_PROGRESS),
            st.get("plan"), st.get("replan"), st.get("calibration"), st.get("observedGeneration"),
            st.get(S.IMAGES_STATUS), conds)


def _server_message(exc: ApiException) -> str:
    """The API server's own words from an error's Status body (else its raw text)."""
    body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else str(exc.body or "")
    try:
        return str(json.loads(body).get("message") or body)[:600]
    except (ValueError, AttributeError):
        return body[:600] or str(exc.reason)


def _record_metrics(namespace: str, name: str, plan: Plan, status: dict[str, Any]) -> None:
    M.PLANNED_BATCH.labels(namespace, name).set(plan.batch)
    M.record_predicted_time(namespace, name, plan.predicted.time_to_target_seconds
                            if plan.samples_to_target_known else None)
    for role, r in (status.get("replicas") or {}).items():
        M.REPLICAS.labels(namespace, name, role, "desired").set(int(r.get("desired") or 0))
        M.REPLICAS.labels(namespace, name, role, "ready").set(int(r.get("ready") or 0))
