"""The resolved run config: what every role process reads (mounted from a ConfigMap, or written by the runner)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlscale.metrics_names import DEFAULT_METRICS_PORT
from rlscale.spec import RLRun, RLRunSpec, SpecError, parse_spec

RUNCONFIG_KIND = "RLRunConfig"
ENV_CONFIG = "RLSCALE_CONFIG"  # role processes also find the file through this variable


@dataclass
class RunConfig:
    """Spec + plan + where things live; JSON on disk so every role reads it without extra deps."""

    run: str
    spec: dict[str, Any]
    plan: dict[str, Any]
    namespace: str | None = None
    ray_address: str | None = None  # host:port of the run's Ray head (GCS)
    metrics_port: int = DEFAULT_METRICS_PORT
    checkpoint_dir: str | None = None
    report_dir: str | None = None
    model_dir: str | None = None  # resolved local model directory, when known
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_rlrun(cls, rlrun: RLRun, plan: dict[str, Any], **kw: Any) -> RunConfig:
        return cls(run=rlrun.name, namespace=rlrun.metadata.namespace, spec=rlrun.to_dict()["spec"], plan=plan, **kw)

    def parsed_spec(self) -> RLRunSpec:
        """The spec as the validated model (the file may have been edited by hand)."""
        return parse_spec(self.spec)

    def to_json(self) -> str:
        return json.dumps({"kind": RUNCONFIG_KIND, **asdict(self)}, indent=2, sort_keys=True)

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
    known = RunConfig.__dataclass_fields__.keys()
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise SpecError([_fe(str(p), f"has unknown keys {unknown}", "regenerate it with this version of rlscale")])
    return RunConfig(**data)


def _fe(path: str, problem: str, fix: str):
    from rlscale.spec import MISSING, FieldError

    return FieldError(path, MISSING, problem, fix)
