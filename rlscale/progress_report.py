"""The driver's progress report to its RLRun (the annotation rlscale.dev/progress): what the operator
folds into status.progress and re-plans from.

It is derived from the step record, and the operator accepts exactly its keys (`ProgressReport.keys()`),
so sender and receiver cannot drift apart. On the wire it is camelCase JSON, as everything Kubernetes sees.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from rlscale.records import StepRecord, finite
from rlscale.roles import Outcome

ANNOTATION_PROGRESS = "rlscale.dev/progress"  # on the RLRun; the operator's constants name it too
MESSAGE_MAX = 1024  # characters of an error message in the report


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


@dataclass
class ProgressReport:
    """Where the run is (step, samples, target), what it measured, and how it ended (the last report)."""

    step: int = 0
    samples: int = 0
    reward: float | None = None  # mean reward of the last training batch
    target_metric: float | None = None  # moving average of the held-out evals
    samples_per_second: float | None = None  # median of the recent steps: one step swings +-50%
    elapsed_seconds: float | None = None  # the run's clock
    phase_seconds: dict[str, float] = field(default_factory=dict)
    # The windowed noise scale when the driver has one (None: not significant, keep the prior).
    noise_scale: float | None = None
    target_reached: bool = False
    failed: bool = False
    time_to_target_seconds: float | None = None
    samples_to_target: int | None = None
    # The configuration the driver runs now (right after a re-plan it may not yet be status.plan's).
    prompts: int | None = None
    samples_per_prompt: int | None = None
    rollout_replicas: int | None = None  # the replicas its last step generated with
    learner_replicas: int | None = None
    learning_rate: float | None = None
    # The rollout as the driver sees it when it reports: the replica count it asked Serve for, the
    # replicas running, and the pods hosting one (starting, running or still draining). The operator
    # removes a rollout pod only once the driver has scaled to the plan's count and the pod hosts
    # none (ordered scaling, docs/architecture.md); None from a driver that does not say.
    rollout_target: int | None = None
    rollout_serving: int | None = None
    rollout_pods: list[str] | None = None
    # A pod's grace period must cover one step plus this.
    checkpoint_seconds: float | None = None
    # What the re-planner reads (rlscale.plan.replan.Measurements.to_dict()).
    measurements: dict[str, Any] | None = None
    outcome: Outcome | None = None
    message: str | None = None  # why the driver stopped, on a failure report
    report: str | None = None  # where the run report lives, on the last report
    # spec.export.hf, on the last report: {"path", "pod"?, "step"?, "seconds"?} of the Hugging Face
    # directory written, or {"path", "error"} when writing it failed (see export_words).
    export: dict[str, Any] | None = None

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The wire keys, camelCase: exactly what the operator accepts."""
        return tuple(camel(f.name) for f in fields(cls))

    @classmethod
    def from_record(cls, rec: StepRecord, *, target_reached: bool, failed: bool = False,
                    outcome: Outcome | None = None, report: str | None = None,
                    measurements: dict[str, Any] | None = None, serving: Any = None,
                    export: dict[str, Any] | None = None) -> ProgressReport:
        """The report of one step record; `outcome`, `report` and `export` on the last one. `serving`: the
        rollout as the driver sees it now (rlscale.rollout.placement.ServingState, or any object with
        its `target`, `running` and `pods`)."""
        sps = rec.samples_per_second_recent
        out = cls(
            step=rec.step, samples=rec.samples, reward=round(rec.reward_mean, 6), target_metric=rec.target_metric,
            samples_per_second=round(sps if sps is not None else rec.samples_per_second, 3),
            elapsed_seconds=round(rec.wall_seconds, 2),
            phase_seconds={k: round(v, 4) for k, v in rec.phases.items()},
            noise_scale=rec.noise_scale_window, target_reached=target_reached, failed=failed,
            time_to_target_seconds=rec.time_to_target_seconds, samples_to_target=rec.samples_to_target,
            prompts=rec.prompts, samples_per_prompt=rec.samples_per_prompt, rollout_replicas=rec.rollout_replicas,
            learner_replicas=rec.learner_replicas, learning_rate=rec.lr, checkpoint_seconds=rec.checkpoint_seconds,
            measurements=measurements, outcome=outcome, report=report, export=export)
        if serving is not None:
            out.rollout_target, out.rollout_serving = int(serving.target), int(serving.running)
            out.rollout_pods = sorted(serving.pods)
        return out

    @classmethod
    def failure(cls, rec: StepRecord | None, message: str, *, permanent: bool) -> ProgressReport:
        """The report of a driver that stops on an error: the last step's figures (if any), the error,
        and outcome Failed when a restart would meet the same error."""
        out = cls.from_record(rec, target_reached=False, failed=True) if rec else cls(failed=True)
        out.message = message[-MESSAGE_MAX:]
        out.outcome = Outcome.FAILED if permanent else None
        return out

    def to_wire(self) -> dict[str, Any]:
        """camelCase JSON object, unset fields left out, NaN and infinities as null."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None or (f.name == "phase_seconds" and not v):
                continue
            out[camel(f.name)] = v.value if isinstance(v, Outcome) else v
        return finite(out)

    def to_json(self) -> str:
        return json.dumps(self.to_wire(), sort_keys=True, allow_nan=False)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ProgressReport:
        """From the annotation's object; keys this version does not know are dropped."""
        by_key = {camel(f.name): f.name for f in fields(cls)}
        kw = {by_key[k]: v for k, v in finite(data).items() if k in by_key}
        if kw.get("outcome") is not None:
            try:
                kw["outcome"] = Outcome(kw["outcome"])
            except ValueError:
                kw["outcome"] = None
        for name in ("phase_seconds", "export"):
            if not isinstance(kw.get(name), dict):
                kw.pop(name, None)
        return cls(**kw)


def export_words(export: dict[str, Any] | None) -> str | None:
    """The end-of-run export (ProgressReport.export, the report's export.json) in words: "exported to
    /checkpoints/export/hf on r-learner-0 (step 40)", or "the export to ... failed: ..."; None without one."""
    if not isinstance(export, dict) or not export.get("path"):
        return None
    where = str(export["path"]) + (f" on {export['pod']}" if export.get("pod") else "")
    if export.get("error"):
        return f"the export to {where} failed: {export['error']}"
    return f"exported to {where}" + (f" (step {export['step']})" if export.get("step") is not None else "")
