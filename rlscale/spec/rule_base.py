"""What every RLRun rule is made of: the rule (its Python check and its CEL twin) and the error it gives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlscale.spec.errors import FieldError


@dataclass(frozen=True)
class Rule:
    """A cross-field rule, checked in Python and emitted as CEL into the CRD."""

    path: str  # the field a user fixes, relative to spec
    cel: str  # over `self` = spec, with all defaults applied
    message: str  # the CEL message (static)
    check: Any  # Callable[[RLRunSpec], FieldError | None]


def _err(path: str, value: Any, problem: str, fix: str) -> FieldError:
    return FieldError("spec." + path, value, problem, fix)


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"
