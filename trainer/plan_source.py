"""Who changes the plan between steps: the driver's own re-planner on one machine, the operator in a
cluster (the driver follows the run config it writes), or nobody (a sweep pins each run)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rlscale.plan import Plan
from rlscale.plan.replan import Measurements, ReplanState, replan
from rlscale.records import StepRecord
from rlscale.runconfig import load_run_config

log = logging.getLogger("rlscale.driver")


@dataclass(frozen=True)
class PlanChange:
    """The plan to run from the next step; `why` is None when only its prediction changed."""

    plan: Plan
    why: str | None = None


class PlanSource(Protocol):
    def after_step(self, plan: Plan, history: Sequence[StepRecord]) -> PlanChange | None: ...


class FixedPlan:
    """The plan never changes (rlscale sweep: each run measures one configuration)."""

    def after_step(self, plan: Plan, history: Sequence[StepRecord]) -> PlanChange | None:
        return None


class Replanner:
    """The driver re-plans itself (rlscale run), with the one re-planner the operator also runs."""

    def __init__(self, spec: Any, resumed_step: int = 0, staleness: int | None = None, host_cores: int = 0):
        self.spec = spec
        self.state = ReplanState(last_step=resumed_step)
        self.staleness = staleness  # pinned by the caller (LocalOptions.staleness): every re-plan keeps it
        self.host_cores = host_cores  # make_plan's: the cpu host's cores `rlscale run` splits to generate ahead

    def after_step(self, plan: Plan, history: Sequence[StepRecord]) -> PlanChange | None:
        if not history:
            return None
        d = replan(self.spec, plan, Measurements.from_records(history), self.state, staleness=self.staleness,
                   host_cores=self.host_cores)
        if d is None:
            return None
        self.state = d.state
        log.info("%s", d.message)
        return PlanChange(d.plan, d.message if d.switched else None)


class FollowOperator:
    """The operator re-plans a run on Kubernetes and writes the plan into the mounted run config; the
    driver applies it between steps (a ConfigMap edit reaches the mounted file within a minute)."""

    def __init__(self, config_path: str | None):
        self.path = config_path
        # Unread: the first step compares the mounted plan with the driver's, so a driver resumed from
        # its checkpoint and plan.json takes a plan the operator changed while it was down.
        self._stamp: tuple | None = None

    def _read_stamp(self) -> tuple | None:
        try:
            st = os.stat(self.path) if self.path else None
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_ino, st.st_size) if st else None

    def after_step(self, plan: Plan, history: Sequence[StepRecord]) -> PlanChange | None:
        stamp = self._read_stamp()
        if stamp is None or stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            new = load_run_config(self.path).plan
        except Exception as exc:  # a half-updated mount: try again next step
            log.warning("run config re-read failed: %s", exc)
            return None
        if new is None:
            return None
        if (new.replan_key, new.learning_rate) == (plan.replan_key, plan.learning_rate):
            return PlanChange(new) if new.predicted != plan.predicted else None
        log.info("following the operator's plan: %s", new.reason)
        return PlanChange(new, "the operator re-planned")
