"""What a bad spec is told: one FieldError per problem (the field, the value, the fix), and
pydantic's validation errors translated into them."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rlscale.spec.models import RLRUN_NAME_MAX


@dataclass(frozen=True)
class FieldError:
    """One problem with a spec: where, what was given, and what to do."""

    path: str
    value: Any
    problem: str
    fix: str = ""

    def __str__(self) -> str:
        shown = "" if self.value is MISSING else f"{_show(self.value)} "
        fix = f"; {self.fix}" if self.fix else ""
        return f"{self.path}: {shown}{self.problem}{fix}"


class SpecError(ValueError):
    """A spec that can never work; `.errors` lists every problem found."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()


def _show(value: Any) -> str:
    """A value as the YAML that wrote it (true, null, [1, 2]); strings quoted."""
    if isinstance(value, str):
        return repr(value) if value else "''"
    if isinstance(value, (bool, type(None), dict, list)):
        text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...").strip()
    else:
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_FIX_BY_TYPE = {
    "greater_than": "use a larger value",
    "greater_than_equal": "use a larger value",
    "less_than": "use a smaller value",
    "less_than_equal": "use a smaller value",
}


def _loc_path(loc: tuple, root: str) -> str:
    parts = [root] if root else []
    for p in loc:
        if isinstance(p, int):
            parts[-1] = f"{parts[-1]}[{p}]" if parts else f"[{p}]"
        elif p in ("int", "constrained-int", "bool", "float", "str") or str(p).startswith(("literal[", "function-")):
            continue  # union branch names are noise for a user
        else:
            parts.append(str(p))
    return ".".join(parts)


def _known_fields(model: type[BaseModel], loc: tuple) -> list[str]:
    """camelCase field names of the model at loc (for 'did you mean')."""
    current: Any = model
    for p in loc[:-1]:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = next((f for n, f in current.model_fields.items() if (f.alias or n) == p or n == p), None)
        if field is None:
            return []
        ann = field.annotation
        args = getattr(ann, "__args__", None)
        current = next((a for a in (args or (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)), None)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [f.alias or n for n, f in current.model_fields.items()]
    return []


def translate(exc: ValidationError, model: type[BaseModel], root: str) -> list[FieldError]:
    out: list[FieldError] = []
    seen: set[str] = set()
    for e in exc.errors(include_url=False):
        path = _loc_path(e["loc"], root)
        typ = e["type"]
        value = e.get("input", MISSING)
        if typ == "extra_forbidden":
            known = _known_fields(model, e["loc"])
            guess = difflib.get_close_matches(str(e["loc"][-1]), known, n=1)
            fix = (f"did you mean {guess[0]!r}?" if guess
                   else f"known fields: {', '.join(known)}" if known else "remove it")
            err = FieldError(path, MISSING, "is not a known field", fix)
        elif typ == "missing":
            err = FieldError(path, MISSING, "is required", "add it")
        elif typ == "literal_error":
            err = FieldError(path, value, "is not allowed", f"use {e['ctx']['expected']}")
        elif path in seen:
            continue  # a union reports one error per branch; the first says enough
        else:
            msg = e["msg"][0].lower() + e["msg"][1:]
            msg = msg.replace("input should be", "must be").replace("should be", "must be")
            msg = msg.removeprefix("value error, ")
            fix = _FIX_BY_TYPE.get(typ, "")
            if typ == "string_pattern_mismatch" and path.endswith("metadata.name"):
                msg, fix = ("is not a valid RLRun name (its Services are named after it)",
                            "use lowercase letters, digits and '-', starting with a letter and ending with a letter or "
                            "digit")
            elif typ == "string_too_long" and path.endswith("metadata.name"):
                msg, fix = (f"is longer than {RLRUN_NAME_MAX} characters (the name is a label value on every pod)",
                            f"use at most {RLRUN_NAME_MAX} characters")
            elif typ in ("model_type", "dict_type"):
                msg, fix = "must be a mapping", "see examples/quickstart.yaml for its fields"
            elif typ in ("too_short", "too_long") and path.endswith(".volume"):
                msg, fix = "must name exactly one volume source", "e.g. {persistentVolumeClaim: {claimName: models}}"
            if typ.startswith(("int_", "greater_than")) and path.endswith(("prompts", "replicas")) and "auto" in str(e[
                "loc"]):
                fix = 'use a positive integer or "auto"'
            err = FieldError(path, value, msg, fix)
        seen.add(path)
        out.append(err)
    return out


def union_fix(errors: list[FieldError]) -> list[FieldError]:
    """prompts/replicas accept "auto" or an integer: say so once, clearly."""
    fixed = []
    for e in errors:
        if e.path.endswith((".prompts", ".replicas")) and e.value is not MISSING:
            e = FieldError(e.path, e.value, "is not allowed", 'use a positive integer or "auto"')
            if e.value == 0 and e.path.endswith(".replicas"):
                e = FieldError(e.path, 0, "is not allowed", 'use a positive integer or "auto" (suspend: true scales to '
                               'zero)')
        fixed.append(e)
    return fixed
