"""The one re-planner: between steps, from what the run measured, keep the plan (predicted anew) or
switch to a configuration that is clearly faster.

The driver calls it on one machine; the operator calls it in a cluster, from the measurements in the
driver's progress report. So one policy runs everywhere, and the fast tests cover the one that runs
in pods. The learner ranks are fixed for the life of a run's processes (a ZeRO checkpoint resumes
only at the data-parallel size it was written with), so a re-plan keeps the learner count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from rlscale.plan.calibration import Calibration
from rlscale.plan.decision import Candidate, Plan, make_plan
from rlscale.records import StepRecord

REPLAN_WARMUP_STEPS = 10  # first steps carry one-off costs (first logprobs call, compiles)
REPLAN_EVERY = 25  # a re-plan at each multiple of this many steps
REPLAN_MIN_GAIN = 0.15  # switch only when the new choice is predicted 15% faster ...
REPLAN_CONFIRM = 2  # ... at this many re-plans in a row: one noisy window does not move the batch
NOISE_WINDOW = 100  # steps whose noise estimates are averaged: one step's are very noisy
THROUGHPUT_MIN_STEPS = 10  # steps a configuration must have run before its measured rate counts

Key = tuple[int, int]  # (prompts, rollout replicas)
# What a re-plan proposes: the key, with the staleness appended when it is not 0 (decision.replan_key).
Choice = tuple[int, ...]


def keep_learners(spec: Any, learners: int | None) -> Any:
    """The spec with learner.replicas pinned to the count the run already has (while the spec leaves
    it on auto): a new count would strand the run's checkpoints."""
    if learners and spec.learner.replicas == "auto" and learners <= spec.learner.max_replicas:
        return spec.model_copy(update={"learner": spec.learner.model_copy(update={"replicas": int(learners)})})
    return spec


def measured_throughput(records: Sequence[StepRecord], min_steps: int = THROUGHPUT_MIN_STEPS,
                        last: int = 50) -> dict[Key, float]:
    """Median samples/s per (prompts, rollout replicas) over the last steps run with it."""
    by: dict[Key, list[float]] = {}
    for r in records:
        by.setdefault((r.prompts, r.rollout_replicas), []).append(r.samples_per_second)
    return {k: float(median(v[-last:])) for k, v in by.items() if len(v) >= min_steps}


@dataclass(frozen=True)
class Measurements:
    """What a re-plan reads of the run so far: the calibration at the configuration it runs, and the
    throughput each configuration it tried measured. The driver computes it from its step records."""

    step: int
    calibration: Calibration
    throughput: dict[Key, float] = field(default_factory=dict)

    @classmethod
    def from_records(cls, records: Sequence[StepRecord]) -> Measurements:
        recent = records[-max(REPLAN_EVERY, NOISE_WINDOW):]
        return cls(step=records[-1].step if records else 0,
                   calibration=Calibration.from_steps(recent, noise_last=NOISE_WINDOW),
                   throughput=measured_throughput(records))

    def to_dict(self) -> dict[str, Any]:
        """camelCase, JSON-able (the progress report carries it)."""
        return {"step": self.step, "calibration": self.calibration.to_dict(),
                "throughput": [{"prompts": p, "rolloutReplicas": r, "samplesPerSecond": round(x, 3)}
                               for (p, r), x in sorted(self.throughput.items())]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Measurements:
        return cls(step=int(d.get("step") or 0),
                   calibration=Calibration.from_dict(d.get("calibration")) or Calibration(),
                   throughput={(int(t["prompts"]), int(t["rolloutReplicas"])): float(t["samplesPerSecond"])
                               for t in d.get("throughput") or []})


@dataclass(frozen=True)
class ReplanState:
    """Between re-plans: the step of the last one, and the change proposed by the re-plans in a row
    that agreed on it (a change goes through at REPLAN_CONFIRM of them). Kept in status on Kubernetes."""

    last_step: int = 0
    proposal: Choice | None = None
    count: int = 0

    def propose(self, key: Choice | None, step: int) -> tuple[ReplanState, bool]:
        """This re-plan's proposal (None: keep the current configuration); True to apply it now."""
        if key is None:
            return ReplanState(step), False
        count = self.count + 1 if key == self.proposal else 1
        if count >= REPLAN_CONFIRM:
            return ReplanState(step), True
        return ReplanState(step, key, count), False

    def to_dict(self) -> dict[str, Any]:
        return {"lastStep": self.last_step, "proposal": list(self.proposal) if self.proposal else None,
                "count": self.count}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> ReplanState:
        d = d or {}
        prop = d.get("proposal")
        return cls(int(d.get("lastStep") or 0), tuple(int(x) for x in prop) if prop else None,
                   int(d.get("count") or 0))


def due(step: int, state: ReplanState) -> bool:
    """A re-plan is due: past the warm-up, and a multiple of REPLAN_EVERY steps reached since the last one."""
    return step >= REPLAN_WARMUP_STEPS and step // REPLAN_EVERY > state.last_step // REPLAN_EVERY


@dataclass(frozen=True)
class Decision:
    """A re-plan's outcome: the plan to run from now on, whether it changed the configuration, and why."""

    plan: Plan
    switched: bool
    message: str
    state: ReplanState


def seconds_to_target(c: Candidate, measured: dict[Key, float], ratio: float = 1.0) -> float:
    """Measured samples/s (times `ratio`) where the configuration has run, the calibrated model elsewhere;
    the run's clock also counts its evals (the same seconds per step at any batch)."""
    sps = measured.get(c.key)
    if not sps:
        return c.predicted.time_to_target_seconds
    e = c.predicted.samples_to_target
    return e / (sps * ratio) + e / c.batch * c.predicted.eval_seconds_per_step


def staleness_ratio(c: Candidate, cands: Sequence[Candidate], staleness: int) -> float | None:
    """The model's samples/s of `c` over its configuration's at `staleness`, the staleness the measured
    rates ran at (1 when `c` has it; None when the candidates lack that configuration there)."""
    if c.staleness == staleness:
        return 1.0
    at = next((o for o in cands if o.staleness == staleness and (o.key, o.learner_replicas, o.placement)
               == (c.key, c.learner_replicas, c.placement)), None)
    return c.predicted.samples_per_second / at.predicted.samples_per_second if at is not None else None


def choose(cands: Sequence[Candidate], measured: dict[Key, float], current: Key,
           staleness: int = 0) -> tuple[Candidate, float, float]:
    """(best candidate, its seconds to target, the current configuration's), the current one at `staleness`.

    A model calibrated at one point is least trustworthy far from it; judging tried
    configurations by what they did keeps the batch from going back and forth. The measured rates
    ran at `staleness`; at another staleness the same configuration's rate is the measured one times
    the model's ratio between the two.
    """
    def seconds(c: Candidate) -> float:
        ratio = staleness_ratio(c, cands, staleness)
        return seconds_to_target(c, measured if ratio is not None else {}, ratio or 1.0)

    best = min(cands, key=seconds)
    cur = next((c for c in cands if c.key == current and c.staleness == staleness), None)
    return best, seconds(best), seconds(cur) if cur else float("inf")


@dataclass(frozen=True)
class Limits:
    """The most replicas a re-plan may ask for, by role (None: no limit): on Kubernetes, what Kueue
    admitted for a queued run (it cannot grow an admitted Workload)."""

    rollout: int | None = None
    learners: int | None = None

    def allow(self, c: Candidate | Plan) -> bool:
        return ((self.rollout is None or c.rollout_replicas <= self.rollout)
                and (self.learners is None or c.learner_replicas <= self.learners))

    def apply(self, spec: Any) -> Any:
        """The spec the planner searches within the limits: rollout.maxReplicas (and an explicit
        rollout.replicas) no higher than the rollout limit. The learner count is kept by every
        re-plan (keep_learners); one above its limit leaves no candidate."""
        if self.rollout is None:
            return spec
        ro, cap = spec.rollout, max(1, int(self.rollout))
        update: dict[str, Any] = {"max_replicas": min(ro.max_replicas, cap)}
        if ro.replicas != "auto":
            update["replicas"] = min(int(ro.replicas), cap)
        return spec.model_copy(update={"rollout": ro.model_copy(update=update)})

    def __str__(self) -> str:
        parts = [f"{n} {what}" for n, what in ((self.rollout, "rollout"), (self.learners, "learner"))
                 if n is not None]
        return " and ".join(parts) + " replicas admitted"


def replan(spec: Any, current: Plan, m: Measurements, state: ReplanState,
           limits: Limits | None = None, staleness: int | None = None, host_cores: int = 0) -> Decision | None:
    """Re-plan at measurement step m.step if one is due (None if not): recalibrate, and switch to the
    fastest candidate when it beats the current configuration by REPLAN_MIN_GAIN at REPLAN_CONFIRM
    re-plans in a row; else keep the current one with its recalibrated prediction. `limits`: no
    candidate above them is chosen, and a current plan above them is left at once. `staleness`: pinned
    (a sweep's run, `rlscale run --staleness`): only candidates at it are chosen, so the plan's
    predicted step is the one at the staleness the run keeps. `host_cores`: make_plan's (`rlscale run` on a
    cpu host)."""
    if not due(m.step, state):
        return None
    lim = limits or Limits()
    if current.placement == "colocated":  # the engines ride on the learner pods: no rollout pods to admit
        lim = Limits(rollout=None, learners=lim.learners)
    # The placement stays too: moving the engines onto (or off) the learner GPUs is a new deployment.
    new = make_plan(lim.apply(keep_learners(spec, current.learner_replicas)), m.calibration, current.placement,
                    host_cores=host_cores)
    cands = [c for c in new.candidates if c.learner_replicas == current.learner_replicas and lim.allow(c)
             and (staleness is None or c.staleness == staleness)]
    if not cands:
        within = f" within the {lim}" if limits else ""
        return Decision(current, False, f"re-plan at step {m.step}: no candidate keeps "
                        f"{current.learner_replicas} learner replicas{within}; plan kept", ReplanState(m.step))
    over = not lim.allow(current)
    best, best_t, cur_t = choose(cands, m.throughput, current.key, current.staleness)
    better = best.replan_key != current.replan_key and (over or best_t < (1 - REPLAN_MIN_GAIN) * cur_t)
    state, confirmed = state.propose(best.replan_key if better else None, m.step)
    if confirmed or over:
        return _switch(new, best, best_t, cur_t, current, m, lim if over else None)
    cur = next((c for c in cands if (c.key, c.staleness) == (current.key, current.staleness)), None)
    plan = current.with_prediction(cur.predicted) if cur is not None else current
    if better:
        msg = (f"re-plan: {_label(best, current)} looks {100 * (1 - best_t / cur_t):.0f}% faster at "
               f"step {m.step}; applied if the next re-plan agrees")
    else:
        msg = f"re-plan at step {m.step}: {current.summary()} kept"
    return Decision(plan, False, msg, state)


def _switch(new: Plan, best: Candidate, best_t: float, cur_t: float, current: Plan, m: Measurements,
            over: Limits | None) -> Decision:
    """The decision that switches to `best`: confirmed by re-plans in a row, or at once because the
    current plan asks for more than `over` allows."""
    basis = "measured" if best.key in m.throughput else "predicted"
    noise = m.calibration.noise_scale
    head = (f"calibrated at step {m.step}: {_label(best, current)} with "
            f"{best.rollout_replicas} rollout {basis} at {best_t:.0f}s to target")
    if over is not None:
        why = (f"{head}, the fastest within the {over}; {current.rollout_replicas} rollout and "
               f"{current.learner_replicas} learner replicas were planned")
    else:
        why = (f"{head} vs {cur_t:.0f}s for {_label(current, best)}, in {REPLAN_CONFIRM} "
               f"re-plans in a row; noise scale {noise or 0:.0f} samples over the last "
               f"{min(NOISE_WINDOW, m.step)} steps")
    return Decision(new.with_choice(best, why), True, why, ReplanState(m.step))


def _label(c: Candidate | Plan, other: Candidate | Plan) -> str:
    """'16x8', with ' at staleness K' when either side runs ahead of the learner."""
    lag = f" at staleness {c.staleness}" if c.staleness or other.staleness else ""
    return f"{c.prompts}x{c.samples_per_prompt}{lag}"
