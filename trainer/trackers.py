"""Experiment trackers as sinks (spec.logging): TensorBoard event files, an MLflow run, a W&B run.

Each logs every step record under the keys of StepRecord.scalars (the metrics.jsonl fields; a dict's
entries as <field>/<key>, the reward's terms as reward/<term>) at the optimiser step, and the plan and
the spec as the run's parameters when it starts. Where they write: the run's report folder
(tensorboard/, mlruns/ unless MLFLOW_TRACKING_URI is set, wandb/ in offline mode unless WANDB_MODE is
set). Their packages are the `tracking` extra; a tracker asked for without its package is refused
before the run starts. A tracker that fails during the run logs a warning and stops logging; the run
goes on.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlscale.plan import Plan
from rlscale.records import StepRecord
from rlscale.roles import RunEnd
from rlscale.spec import FieldError, SpecError

log = logging.getLogger("rlscale.driver")

# spec.logging's field -> the module it needs (in the `tracking` extra).
TRACKERS = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
FIX = "pip install 'rlscale[tracking]'"


def check_trackers(logging_spec: Any) -> list[FieldError]:
    """A FieldError for each tracker spec.logging asks for whose package is not installed (no import)."""
    return [FieldError(f"spec.logging.{name}", True, f"needs the {module} package, which is not installed",
                       f"{FIX} (or set spec.logging.{name}: false)")
            for name, module in TRACKERS.items()
            if getattr(logging_spec, name, False) and importlib.util.find_spec(module) is None]


def tracker_sinks(spec: Any, run_dir: Path, name: str) -> list[Any]:
    """The sinks of the trackers spec.logging asks for; SpecError naming the field when one cannot run."""
    errors = check_trackers(spec.logging)
    if errors:
        raise SpecError(errors)
    sinks: list[Any] = []
    for field, cls in (("tensorboard", TensorBoardSink), ("mlflow", MLflowSink), ("wandb", WandbSink)):
        if getattr(spec.logging, field):
            try:
                sinks.append(cls(spec, Path(run_dir), name))
            except ImportError as exc:  # installed, but broken (a dependency at the wrong version)
                raise SpecError([FieldError(f"spec.logging.{field}", True, f"cannot import its package ({exc})",
                                            FIX)]) from None
    return sinks


def flat_params(spec: Any, plan: Plan) -> dict[str, str]:
    """The plan and the spec as flat string parameters: plan.prompts, spec.task.reward, ..."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        else:
            out[prefix] = value if isinstance(value, str) else json.dumps(value)

    walk("plan", {k: v for k, v in plan.to_dict().items() if k != "candidates"})
    walk("spec", spec_dict(spec))
    return out


def spec_dict(spec: Any) -> dict:
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True) if hasattr(spec, "model_dump") else {}


class _Tracker:
    """A sink that never fails the run: the first error is logged, and the tracker stops."""

    kind = "tracker"

    def __init__(self, spec: Any, run_dir: Path, name: str):
        self.spec, self.dir, self.name = spec, run_dir, name
        self.failed = False

    def _guard(self, what: str, fn: Any, *args: Any) -> None:
        if self.failed:
            return
        try:
            fn(*args)
        except Exception:
            self.failed = True
            log.exception("%s: %s failed; it logs nothing more (the run goes on)", self.kind, what)

    def start(self, plan: Plan, state: Any, resumed: bool) -> None:
        self._guard("start", self._start, plan, state, resumed)

    def plan_changed(self, plan: Plan, at_step: int, why: str | None) -> None:
        pass

    def rollout_changed(self, serving: Any, scaled: bool) -> None:
        pass

    def record(self, rec: StepRecord, history: Sequence[StepRecord]) -> None:
        self._guard("logging a step", self._record, rec)

    def end(self, end: RunEnd, history: Sequence[StepRecord], target_reached: bool) -> None:
        self._guard("closing", self._end, end)

    def _start(self, plan: Plan, state: Any, resumed: bool) -> None: ...

    def _record(self, rec: StepRecord) -> None: ...

    def _end(self, end: RunEnd) -> None: ...


class TensorBoardSink(_Tracker):
    """Event files in <report>/tensorboard/: one scalar series per key, the plan and spec as text."""

    kind = "spec.logging.tensorboard"

    def __init__(self, spec: Any, run_dir: Path, name: str):
        super().__init__(spec, run_dir, name)
        import tensorboard  # noqa: F401 - torch's writer needs it; refused here, before the run, without it
        from torch.utils.tensorboard import SummaryWriter

        self._writer_cls = SummaryWriter
        self.writer: Any = None

    def _start(self, plan: Plan, state: Any, resumed: bool) -> None:
        # A resume redoes the steps after its checkpoint: their old events are dropped.
        self.writer = self._writer_cls(str(self.dir / "tensorboard"), flush_secs=10,
                                       purge_step=state.step + 1 if resumed else None)
        self.writer.add_text("plan", "```\n" + json.dumps(plan.to_dict(), indent=2) + "\n```", state.step)
        if not resumed:
            self.writer.add_text("spec", "```\n" + json.dumps(spec_dict(self.spec), indent=2) + "\n```", 0)

    def _record(self, rec: StepRecord) -> None:
        for key, value in rec.scalars().items():
            self.writer.add_scalar(key, value, rec.step, walltime=rec.time or None)

    def _end(self, end: RunEnd) -> None:
        self.writer.close()


_MLFLOW_KEY = re.compile(r"[^\w\-. /]")  # what an MLflow key may hold (a plug-in's ':' may not)


class MLflowSink(_Tracker):
    """An MLflow run (named after the RLRun, in experiment spec.logging.project) in the file store
    <report>/mlruns, or at MLFLOW_TRACKING_URI; a resumed run logs into the same MLflow run."""

    kind = "spec.logging.mlflow"

    def __init__(self, spec: Any, run_dir: Path, name: str):
        super().__init__(spec, run_dir, name)
        from mlflow.tracking import MlflowClient

        self.uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
        if self.uri.startswith("file:"):  # MLflow 3 refuses its file store unless told (it needs no server)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=self.uri)
        self.run_id: str | None = None

    def _start(self, plan: Plan, state: Any, resumed: bool) -> None:
        from mlflow.entities import Param

        kept = self.dir / "mlflow-run-id"
        if resumed and kept.exists():
            self.run_id = kept.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
            return
        project = self.spec.logging.project
        exp = self.client.get_experiment_by_name(project)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(project)
        self.run_id = self.client.create_run(exp_id, run_name=self.name, tags={"rlscale.run": self.name}).info.run_id
        kept.write_text(self.run_id)
        params = [Param(_MLFLOW_KEY.sub("_", k)[:250], v[:6000]) for k, v in flat_params(self.spec, plan).items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def _record(self, rec: StepRecord) -> None:
        from mlflow.entities import Metric

        ms = int((rec.time or time.time()) * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(_MLFLOW_KEY.sub("_", k), v, ms, rec.step)
                                                    for k, v in rec.scalars().items()])

    def _end(self, end: RunEnd) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if end in (RunEnd.TARGET, RunEnd.BUDGET) else "KILLED")


class WandbSink(_Tracker):
    """A W&B run in <report>/wandb/, offline unless WANDB_MODE says otherwise (`wandb sync` uploads it);
    its id follows the report folder, so a resumed run continues it."""

    kind = "spec.logging.wandb"

    def __init__(self, spec: Any, run_dir: Path, name: str):
        super().__init__(spec, run_dir, name)
        import wandb

        self.wandb = wandb
        self.run: Any = None

    def _start(self, plan: Plan, state: Any, resumed: bool) -> None:
        os.environ.setdefault("WANDB_MODE", "offline")
        run_id = re.sub(r"[^A-Za-z0-9_-]", "-", self.name)[:40] + "-" + hashlib.sha1(
            str(self.dir.resolve()).encode()).hexdigest()[:8]
        self.run = self.wandb.init(project=self.spec.logging.project, name=self.name, id=run_id, resume="allow",
                                   dir=str(self.dir), config={"plan": plan.to_dict(), "spec": spec_dict(self.spec)},
                                   settings=self.wandb.Settings(console="off", silent=True))

    def _record(self, rec: StepRecord) -> None:
        self.run.log(rec.scalars(), step=rec.step)

    def _end(self, end: RunEnd) -> None:
        self.run.finish(exit_code=0 if end in (RunEnd.TARGET, RunEnd.BUDGET) else 1)
