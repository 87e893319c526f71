"""Where the driver's step records go: the run's log (metrics.jsonl and plan.json, kept across a
resume), Prometheus, and the progress report to the RLRun. The loop calls every sink the same way."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from rlscale.kube_report import ProgressReporter
from rlscale.plan import Plan
from rlscale.plan.replan import Measurements
from rlscale.progress_report import ProgressReport
from rlscale.records import StepRecord, append_record, read_records, write_records
from rlscale.report import EXPORT_NOTE, write_report
from rlscale.roles import RunEnd
from rlscale.run_metrics import RunMetrics

log = logging.getLogger("rlscale.driver")


class Sink(Protocol):
    """Receives the run's start (fresh or resumed), its plan changes, each finished step record, the
    rollout's replicas when they change, and its end."""

    def start(self, plan: Plan, state: Any, resumed: bool) -> None: ...

    def plan_changed(self, plan: Plan, at_step: int, why: str | None) -> None: ...

    def rollout_changed(self, serving: Any, scaled: bool) -> None:
        """The rollout's replicas as the driver now sees them (trainer.ports.Serving); `scaled`: right
        after the driver scaled Serve."""
        ...

    def record(self, rec: StepRecord, history: Sequence[StepRecord]) -> None: ...

    def end(self, end: RunEnd, history: Sequence[StepRecord], target_reached: bool) -> None: ...


class EndSink:
    """A sink that acts only at the run's end (`end`); every other event passes it by."""

    def start(self, plan: Plan, state: Any, resumed: bool) -> None:
        pass

    def plan_changed(self, plan: Plan, at_step: int, why: str | None) -> None:
        pass

    def rollout_changed(self, serving: Any, scaled: bool) -> None:
        pass

    def record(self, rec: StepRecord, history: Sequence[StepRecord]) -> None:
        pass

    def end(self, end: RunEnd, history: Sequence[StepRecord], target_reached: bool) -> None:
        pass


class RunLog:
    """runs/<name>/ (or report/ on the checkpoint volume): metrics.jsonl, plan.json and, at the end, the report."""

    def __init__(self, run_dir: Path, target: float, metric: str, name: str, report: bool = True):
        self.dir = Path(run_dir)
        self.target, self.metric, self.name, self.report = target, metric, name, report
        self.dir.mkdir(parents=True, exist_ok=True)

    @property
    def metrics(self) -> Path:
        return self.dir / "metrics.jsonl"

    def start_fresh(self, plan: Plan) -> None:
        """A run without a checkpoint starts its log afresh; an old one is kept beside it (an earlier
        run's export note goes: this run's summary names only what this run exports)."""
        self._write_plans([{**plan.to_dict(), "atStep": 0}])
        (self.dir / EXPORT_NOTE).unlink(missing_ok=True)
        if self.metrics.exists():
            os.replace(self.metrics, self.dir / f"metrics.{time.strftime('%Y%m%dT%H%M%S')}.jsonl")

    def resume(self, step: int) -> tuple[list[StepRecord], Plan | None]:
        """The records up to the checkpoint's step and the newest plan. Steps after the checkpoint are
        redone: they move to metrics.redone.jsonl, so the log stays one history and nothing measured is lost."""
        logged = read_records(self.metrics)
        kept = [r for r in logged if r.step <= step]
        redone = [r for r in logged if r.step > step]
        if redone:
            with open(self.dir / "metrics.redone.jsonl", "a", encoding="utf-8") as f:
                f.writelines(r.to_json() + "\n" for r in redone)
        write_records(self.metrics, kept)
        plans = self.plans()
        return kept, Plan.from_dict(plans[-1]) if plans else None

    def plans(self) -> list[dict]:
        p = self.dir / "plan.json"
        return json.loads(p.read_text())["plans"] if p.exists() else []

    def _write_plans(self, plans: list[dict]) -> None:
        tmp = self.dir / "plan.json.tmp"
        tmp.write_text(json.dumps({"plans": plans}, indent=2))
        os.replace(tmp, self.dir / "plan.json")

    def start(self, plan: Plan, state: Any, resumed: bool) -> None:
        pass

    def plan_changed(self, plan: Plan, at_step: int, why: str | None) -> None:
        if why is not None:  # a new prediction alone is no new plan
            self._write_plans([*self.plans(), {**plan.to_dict(), "atStep": at_step, "why": why}])

    def rollout_changed(self, serving: Any, scaled: bool) -> None:
        pass  # each step record says how many replicas generated it

    def record(self, rec: StepRecord, history: Sequence[StepRecord]) -> None:
        append_record(self.metrics, rec)

    def end(self, end: RunEnd, history: Sequence[StepRecord], target_reached: bool) -> None:
        if not self.report:
            return
        try:
            write_report(self.dir, self.target, self.metric, self.name)
        except Exception:  # the run and its metrics.jsonl stand; its ending must still be reported
            log.exception("writing the report in %s failed", self.dir)


class PrometheusSink:
    """The run's /metrics (RunMetrics), updated from the plan and every step record."""

    def __init__(self, metrics: RunMetrics, target: float):
        self.metrics = metrics
        metrics.target_value.set(target)

    def start(self, plan: Plan, state: Any, resumed: bool) -> None:
        """The plan and weights version; after a resume the counters continue from the checkpointed
        totals and a reached target stays shown."""
        self.metrics.set_plan(plan)
        self.metrics.version.set(state.version)
        if not resumed:
            return
        self.metrics.restore_totals(state.step, state.samples, state.generated_tokens_total,
                                    state.trained_tokens_total)
        reached = (state.tracker or {}).get("reached_at")
        if reached:
            self.metrics.ttt.set(reached["seconds"])
            self.metrics.stt.set(reached["samples"])

    def plan_changed(self, plan: Plan, at_step: int, why: str | None) -> None:
        self.metrics.set_plan(plan)

    def rollout_changed(self, serving: Any, scaled: bool) -> None:
        pass

    def record(self, rec: StepRecord, history: Sequence[StepRecord]) -> None:
        self.metrics.observe_step(rec)

    def end(self, end: RunEnd, history: Sequence[StepRecord], target_reached: bool) -> None:
        pass


class KubeSink:
    """The progress report to the RLRun (a pod's driver): every few seconds, the last one with the
    outcome, and one at once after the driver scaled the rollout (the operator removes the pods a
    scale-down freed only once the report says they host no replica)."""

    def __init__(self, reporter: ProgressReporter, report_location: str):
        self.reporter = reporter
        self.report_location = report_location
        self.serving: Any = None
        self._last: tuple[StepRecord, Sequence[StepRecord]] | None = None
        self.export: dict[str, Any] | None = None  # spec.export.hf's outcome, for the last report

    def exported(self, export: dict[str, Any]) -> None:
        """The end-of-run export's note (trainer.export_sink), told before end()."""
        self.export = export

    def start(self, plan: Plan, state: Any, resumed: bool) -> None:
        pass

    def plan_changed(self, plan: Plan, at_step: int, why: str | None) -> None:
        pass

    def rollout_changed(self, serving: Any, scaled: bool) -> None:
        self.serving = serving
        if scaled and self._last is not None:
            rec, history = self._last
            self.reporter.report(self._report(rec, history, rec.time_to_target_seconds is not None), force=True)

    def record(self, rec: StepRecord, history: Sequence[StepRecord]) -> None:
        self._last = (rec, history)
        if self.reporter.due():
            self.reporter.report(self._report(rec, history, rec.time_to_target_seconds is not None))

    def end(self, end: RunEnd, history: Sequence[StepRecord], target_reached: bool) -> None:
        if history:
            last = self._report(history[-1], history, target_reached, end.outcome, self.report_location)
            last.export = self.export
            self.reporter.report(last, force=True)

    def _report(self, rec: StepRecord, history: Sequence[StepRecord], reached: bool, outcome=None,
                location: str | None = None) -> ProgressReport:
        # The operator re-plans from these measurements (rlscale.plan.replan), as the driver does locally.
        return ProgressReport.from_record(rec, target_reached=reached, outcome=outcome, report=location,
                                          measurements=Measurements.from_records(history).to_dict(),
                                          serving=self.serving)


class ClosesRewardPool(EndSink):
    """Ends the reward's worker processes (trainer.reward_pool) when the run ends."""

    def __init__(self, reward: Any):
        self.reward = reward

    def end(self, end: RunEnd, history: Sequence[StepRecord], target_reached: bool) -> None:
        self.reward.close()
