"""The resolved run config: what every role process reads (mounted from a ConfigMap, or written by the runner)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from rlscale.metrics_names import DEFAULT_METRICS_PORT
from rlscale.plan import Plan
from rlscale.spec import MISSING, FieldError, RLRun, RLRunSpec, SpecError, parse_spec

RUNCONFIG_KIND = "RLRunConfig"
ENV_CONFIG = "RLSCALE_CONFIG"  # role processes also find the file through this variable


@dataclass
class LocalOptions:
    """How `rlscale run` (and `rlscale sweep`) run the roles as processes of this machine; in pods there are none."""

    head_cpus: int | None = None  # CPUs the Ray head offers (the rollout processes' share of the cores)
    rollout_cpu_threads: int | None = None  # threads each rollout engine may use: the cores over the most replicas
    linger_seconds: float = 0.0  # keep /metrics up this long after the run ends (a scraper's last look)
    replan: bool = True  # the driver re-plans between steps (a sweep pins each run's configuration)
    rollout_app: str | None = None  # a rollout app kept across runs (rlscale sweep's shared nodes) to attach to
    # Generating ahead (the plan's staleness > 0): the CPUs the Ray head and rollout processes are
    # pinned to, and the learner's, disjoint so that overlapping them is not contention (cpu_split.py).
    rollout_cpus: list[int] | None = None
    learner_cpus: list[int] | None = None
    # The staleness every plan of the run keeps, whatever the planner would choose (rlscale sweep
    # --staleness, tests); None: the plan's choice within spec.algorithm.maxStaleness.
    staleness: int | None = None

    def cores(self) -> dict[str, int] | None:
        """{"rollout": n, "learner": m} when the cores are split (StepRecord.cores), else None."""
        if not (self.rollout_cpus and self.learner_cpus):
            return None
        return {"rollout": len(self.rollout_cpus), "learner": len(self.learner_cpus)}


@dataclass
class RunConfig:
    """Spec + plan + where things live; JSON on disk so every role reads it without extra deps."""

    run: str
    spec: RLRunSpec
    plan: Plan | None = None  # the planned configuration; roles other than the learner need none
    namespace: str | None = None
    ray_address: str | None = None  # host:port of the run's Ray head (GCS)
    metrics_port: int = DEFAULT_METRICS_PORT
    checkpoint_dir: str | None = None
    report_dir: str | None = None
    model_dir: str | None = None  # resolved local model directory, when known
    model_cache: str | None = None  # where pods resolve the model (the model volume); None: the user's cache
    object_store_bytes: int | None = None  # each Ray node's object store (published weights live there)
    # Moves the prompt order and the sampling seeds (rlscale run --seed, rlscale sweep --seeds); None: spec.seed,
    # so a run on Kubernetes (whose config the operator writes) seeds from its spec.
    seed: int | None = None
    local: LocalOptions | None = None  # None in a pod

    def __post_init__(self) -> None:
        # Mappings as they come from JSON (or a test): the spec validated, the plan rebuilt.
        if isinstance(self.spec, dict):
            self.spec = parse_spec(self.spec)
        if isinstance(self.plan, dict):
            self.plan = Plan.from_dict(self.plan) if self.plan else None
        if isinstance(self.local, dict):
            self.local = LocalOptions(**self.local)
        if self.seed is None:
            self.seed = self.spec.seed

    @classmethod
    def from_rlrun(cls, rlrun: RLRun, plan: Plan, **kw: Any) -> RunConfig:
        return cls(run=rlrun.name, namespace=rlrun.metadata.namespace, spec=rlrun.spec, plan=plan, **kw)

    @property
    def in_pod(self) -> bool:
        return self.local is None

    def the_plan(self) -> Plan:
        """The plan, for the roles that need one; an error naming the file's fix when it has none."""
        if self.plan is None:
            raise SpecError([FieldError(f"run config {self.run!r}: plan", MISSING, "is missing",
                                        "the learner needs the planned configuration; regenerate the run config "
                                        "(`rlscale run`, or the operator's ConfigMap)")])
        return self.plan

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["spec"] = self.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
        out["plan"] = self.plan.to_dict() if self.plan is not None else None
        out["local"] = asdict(self.local) if self.local is not None else None
        return out

    def to_json(self) -> str:
        return json.dumps({"kind": RUNCONFIG_KIND, **self.to_dict()}, indent=2, sort_keys=True)

    def save(self, path: str | Path) -> Path:
        """Write atomically, so a role never reads half a file."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(self.to_json(), encoding="utf-8")
        os.replace(tmp, p)
        return p


def load_run_config(path: str | Path | None = None) -> RunConfig:
    """Read a run config from path, or from $RLSCALE_CONFIG; errors name the file and the fix."""
    p = Path(path or os.environ.get(ENV_CONFIG, ""))
    if not str(p) or not p.is_file():
        raise SpecError([_fe(str(p) or ENV_CONFIG, "is not a run config file",
                             "pass --config FILE (written by `rlscale run` or mounted by the operator)")])
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SpecError([_fe(str(p), f"is not valid JSON ({exc.msg} at line {exc.lineno})", "regenerate it")]) from None
    if not isinstance(data, dict) or data.pop("kind", None) != RUNCONFIG_KIND:
        raise SpecError([_fe(str(p), f"is not an {RUNCONFIG_KIND}", "pass the run config, not the RLRun YAML")])
    known = {f.name for f in fields(RunConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise SpecError([_fe(str(p), f"has unknown keys {unknown}", "regenerate it with this version of rlscale")])
    return RunConfig(**data)


def _fe(path: str, problem: str, fix: str) -> FieldError:
    return FieldError(path, MISSING, problem, fix)
