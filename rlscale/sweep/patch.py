"""The calibration patch a sweep writes (--write-calibration) and `rlscale plan --calibration` reads.

A patch is YAML: `spec:` is an RLRun spec fragment merged over the spec being planned
(optimizer.noiseScale from the sweep's fit), and `calibration:` the step phases the planner's
throughput model is scaled to, as if measured at that configuration, and the staleness penalty p
(stalenessPenalty) when the sweep ran --staleness.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import yaml

from rlscale.plan import Calibration
from rlscale.plan.calibration import CAMEL_FIELDS, cores_of
from rlscale.spec import FULL_API_VERSION, MISSING, FieldError, SpecError, parse_rlrun, safe_load_all

PATCH_KIND = "RLRunCalibration"
# The noise scale goes into the spec (optimizer.noiseScale), not the calibration; the staleness penalty
# may be 0, so it is checked apart from the positive figures.
PENALTY_KEY = "stalenessPenalty"
_FIELDS = {k: v for k, v in CAMEL_FIELDS.items() if k not in ("noiseScale", PENALTY_KEY)}


def patch_dict(res: Any, source: str) -> dict[str, Any]:
    """The patch from a SweepResult: noise scale into the spec, fitted phases into the calibration."""
    out: dict[str, Any] = {"apiVersion": FULL_API_VERSION, "kind": PATCH_KIND,
                           "metadata": {"name": res.name, "source": source}, "spec": {}}
    b = res.noise_for_patch()
    if b and math.isfinite(b):
        out["spec"]["optimizer"] = {"noiseScale": round(float(b), 1)}
    cal = res.fitted
    if cal is not None and cal.has_phases:
        c = {k: v for k, v in cal.to_dict().items() if k in _FIELDS or k == "phases"}
        c["phases"] = {p: round(float(v), 6) for p, v in c["phases"].items()}
        out["calibration"] = {k: round(float(v), 6) if isinstance(v, float) else v for k, v in c.items()}
    fit = getattr(res, "staleness", None)
    if fit is not None and fit.for_patch is not None:
        out.setdefault("calibration", {})[PENALTY_KEY] = fit.for_patch
    out["measured"] = {  # for the reader; rlscale plan ignores it
        "level": res.level, "referencePrompts": res.ref_prompts,
        "samplesToLevel": {f"{c.rule}/{c.prompts}": round(c.e_mean) for c in res.cells if c.e_mean},
        "samplesPerSecond": {f"{c.rule}/{c.prompts}": round(c.throughput, 2) for c in res.cells if c.throughput},
    }
    if fit is not None and fit.p is not None:
        out["measured"]["stalenessFit"] = {"p": round(fit.p, 4), "ciLow": fit.ci and round(fit.ci[0], 4),
                                           "ciHigh": fit.ci and round(fit.ci[1], 4), "points": fit.points}
    if res.noise is not None:
        out["measured"]["noiseFit"] = {"eMin": round(res.noise.e_min), "bNoise": res.noise.b_noise and
                                       round(res.noise.b_noise), "bNoiseLow": res.noise.b_noise_low and
                                       round(res.noise.b_noise_low), "significant": res.noise.significant}
    return out


HEADER = ("# Written by `rlscale sweep`: the sweep's fitted noise scale and throughput model.\n"
          "# Use: rlscale plan RLRUN.yaml --calibration THIS.yaml\n"
          "# spec: merged over the RLRun's spec. calibration: phase seconds the planner's throughput\n"
          "# model is scaled to (per-phase factors fitted over every swept batch, at this configuration).\n")


def write_patch(res: Any, path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + yaml.safe_dump(patch_dict(res, source), sort_keys=False), encoding="utf-8")
    return path


def _err(where: str, value: Any, problem: str, fix: str) -> SpecError:
    return SpecError([FieldError(where, value if value is not None else MISSING, problem, fix)])


def merge(base: Any, over: Any) -> Any:
    """Mappings merge key by key; anything else in `over` replaces."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = copy.deepcopy(base)
        for k, v in over.items():
            out[k] = merge(base.get(k), v)
        return out
    return copy.deepcopy(over)


def load_patch(path: Path) -> dict[str, Any]:
    try:
        docs = safe_load_all(Path(path).read_text(encoding="utf-8"))
        data = docs[0] if docs else None
    except OSError as exc:
        raise _err(str(path), None, f"cannot be read ({exc.strerror})",
                   "pass the file `rlscale sweep --write-calibration` wrote") from None
    except yaml.YAMLError as exc:
        raise _err(str(path), None, f"is not YAML ({exc})", "pass the file `rlscale sweep` wrote") from None
    if not isinstance(data, dict) or data.get("kind") != PATCH_KIND:
        kind = data.get("kind") if isinstance(data, dict) else type(data).__name__
        raise _err(f"{path}: kind", kind, f"is not {PATCH_KIND}",
                   "pass a calibration patch (from `rlscale sweep --write-calibration`), not an RLRun")
    for key in ("spec", "calibration"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise _err(f"{path}: {key}", data[key], "is not a mapping", f"write {key}: as a mapping or leave it out")
    return data


def apply_patch(rlrun: Any, patch: dict[str, Any], path: Path) -> tuple[Any, Calibration]:
    """The RLRun with the patch's spec merged over it (validated again), and the patch's Calibration."""
    merged = merge(rlrun.to_dict(), {"spec": patch.get("spec") or {}})
    try:
        new = parse_rlrun(merged)
    except SpecError as exc:
        raise SpecError([FieldError(f"{path}: {e.path}", e.value, e.problem, e.fix) for e in exc.errors]) from None
    return new, calibration_from(patch.get("calibration") or {}, path)


def calibration_from(c: dict[str, Any], path: Path) -> Calibration:
    kw: dict[str, Any] = {}
    for key, attr in _FIELDS.items():
        if key in c:
            v = c[key]
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
                raise _err(f"{path}: calibration.{key}", v, "is not a positive number", "rewrite it with rlscale sweep")
            kw[attr] = int(v) if attr in ("prompts", "samples_per_prompt", "rollout_replicas", "learner_replicas",
                                           "steps") else float(v)
    if c.get(PENALTY_KEY) is not None:
        v = c[PENALTY_KEY]
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 10:
            raise _err(f"{path}: calibration.{PENALTY_KEY}", v, "is not a penalty from 0 to 10 per step of staleness",
                       "rewrite it with rlscale sweep --staleness")
        kw["staleness_penalty"] = float(v)
    if c.get("cores") is not None:
        kw["cores"] = cores_of(c["cores"])
        if kw["cores"] is None:
            raise _err(f"{path}: calibration.cores", c["cores"], "is not {rollout: n, learner: m} with n, m >= 1",
                       "give the cores each side ran on, or leave it out (the phases ran on every core)")
    phases = c.get("phases") or {}
    if not isinstance(phases, dict):
        raise _err(f"{path}: calibration.phases", phases, "is not a mapping", "give seconds per phase")
    for p, v in phases.items():
        if p not in ("generate", "reward", "train", "sync"):
            raise _err(f"{path}: calibration.phases.{p}", v, "is not a phase", "use generate, reward, train or sync")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise _err(f"{path}: calibration.phases.{p}", v, "is not a number of seconds", "give seconds >= 0")
        kw[f"{p}_s"] = float(v)
    if phases and ("prompts" not in kw or "samples_per_prompt" not in kw):
        raise _err(f"{path}: calibration.prompts", None, "is missing beside phases",
                   "give the prompts and samplesPerPrompt the phases were measured at")
    return Calibration(**kw)
