"""Non-finite numbers (NaN, infinity) in what the operator writes: the API server stores JSON, which has
none, so a status holding one is refused whole and the run's every pass would fail on it. The planner's
arithmetic on a spec's extreme figures, or a driver's report, are where they come from."""

from __future__ import annotations

import math
from typing import Any


def nonfinite(obj: Any, path: str = "") -> list[str]:
    """The paths (a.b[2].c) of every non-finite float in a JSON-like tree."""
    if isinstance(obj, float):
        return [] if math.isfinite(obj) else [path or "(value)"]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in nonfinite(v, f"{path}.{k}" if path else str(k))]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in nonfinite(v, f"{path}[{i}]")]
    return []


def finite_only(obj: Any) -> Any:
    """A copy with every non-finite float left out: a mapping's key dropped, a list's item null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_only(v) for k, v in obj.items() if not (isinstance(v, float) and not math.isfinite(v))}
    if isinstance(obj, (list, tuple)):
        return [finite_only(v) for v in obj]
    return obj
