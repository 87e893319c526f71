"""The RLRun CustomResourceDefinition, generated from the pydantic spec (never edited by hand)."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from rlscale.spec import (
    API_GROUP,
    API_VERSION,
    KIND,
    PROJECTED_SOURCES,
    RLRUN_NAME_MAX,
    RLRUN_NAME_RE,
    VALUE_FROM_KINDS,
    VOLUME_SOURCES,
    ExtraVolume,
    RLRunSpec,
)
from rlscale.spec.rules import RULES
from rlscale.spec.syntax import DNS_SUBDOMAIN_MAX, DNS_SUBDOMAIN_RE, INT_MAX, MAX_RESOURCE_NAMES

PLURAL = "rlruns"
SINGULAR = "rlrun"
SHORT_NAMES = ["rlr"]

# Every phase the operator writes (rlscale.operator.constants names each; a test holds them equal).
PHASES = ("Pending", "Queued", "Running", "Succeeded", "BudgetExhausted", "Failed", "Suspended")

# Status paths the operator writes and the printer columns read (one place for both).
STATUS_PHASE = ".status.phase"
STATUS_BATCH = ".status.plan.batch"  # "16x8": prompts x samplesPerPrompt
STATUS_LR = ".status.plan.learningRate"
STATUS_ROLLOUT = ".status.plan.rolloutReplicas"
STATUS_LEARNER = ".status.plan.learnerReplicas"
STATUS_REWARD = ".status.progress.reward"
STATUS_TTT = ".status.progress.timeToTarget"  # "4m12s", or "eta 3m" before the target

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": STATUS_PHASE},
    {"name": "Batch", "type": "string", "jsonPath": STATUS_BATCH, "description": "prompts x samplesPerPrompt"},
    {"name": "LR", "type": "number", "jsonPath": STATUS_LR},
    {"name": "Rollout", "type": "integer", "jsonPath": STATUS_ROLLOUT},
    {"name": "Learner", "type": "integer", "jsonPath": STATUS_LEARNER},
    {"name": "Reward", "type": "number", "jsonPath": STATUS_REWARD},
    {"name": "Target-Time", "type": "string", "jsonPath": STATUS_TTT, "description": "time-to-target, or ETA"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _constraints(info: FieldInfo | None, out: dict[str, Any]) -> None:
    for m in info.metadata if info else []:
        if isinstance(m, Gt) and out.get("type") == "integer":
            out["minimum"] = m.gt + 1
        elif isinstance(m, Gt):
            out.update(minimum=m.gt, exclusiveMinimum=True)
        elif isinstance(m, Ge):
            out["minimum"] = m.ge
        elif isinstance(m, Lt):
            out.update(maximum=m.lt, exclusiveMaximum=True)
        elif isinstance(m, Le):
            out["maximum"] = m.le
        elif isinstance(m, MinLen):
            out[{"object": "minProperties", "array": "minItems"}.get(out.get("type"), "minLength")] = m.min_length
        elif isinstance(m, MaxLen):
            out[{"object": "maxProperties", "array": "maxItems"}.get(out.get("type"), "maxLength")] = m.max_length
        elif getattr(m, "pattern", None):
            out["pattern"] = m.pattern


def _open(description: str, **props: dict[str, Any]) -> dict[str, Any]:
    """An object whose named properties CEL reads, open to the rest of its Kubernetes fields."""
    out: dict[str, Any] = {"description": description, "type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {**out, "properties": props} if props else out


def _name(description: str) -> dict[str, Any]:
    return {"description": description, "type": "string", "maxLength": DNS_SUBDOMAIN_MAX, "pattern": DNS_SUBDOMAIN_RE}


def volume_source_properties() -> dict[str, Any]:
    """The volume sources an RLRun may use (VOLUME_SOURCES), each declared so that CEL can see it;
    any other source is not in the schema, so the API server refuses it (strict field
    validation) or prunes it, leaving a volume with no source that the CEL rule refuses."""
    secret_ref = _open("A Secret's keys as files.", name=_name("The Secret's name (not a run's *-ray-token)."))
    projection = {"description": "One projection: " + ", ".join(PROJECTED_SOURCES) + ".", "type": "object",
                  "properties": {"configMap": _open("A ConfigMap's keys as files."), "secret": secret_ref,
                                 "downwardAPI": _open("Pod fields as files.")}}
    props = {
        "persistentVolumeClaim": _open("A PersistentVolumeClaim in the run's namespace (claimName)."),
        "ephemeral": _open("A claim created and deleted with the pod (volumeClaimTemplate; not cloned from a "
                           "dataSource).", volumeClaimTemplate=_open("The claim.", spec=_open(
                               "The claim's spec.", dataSource=_open("Refused."), dataSourceRef=_open("Refused.")))),
        "configMap": _open("A ConfigMap's keys as files (name)."),
        "secret": _open("A Secret's keys as files (secretName).", secretName=_name(
            "The Secret's name (not a run's *-ray-token).")),
        "emptyDir": _open("Scratch space that lives as long as the pod."),
        "downwardAPI": _open("Pod fields as files."),
        "projected": _open("Several of " + ", ".join(PROJECTED_SOURCES) + " in one directory.", sources={
            "description": "The projections.", "type": "array", "maxItems": 16, "items": projection}),
    }
    assert tuple(props) == VOLUME_SOURCES
    return props


def _value_from_schema() -> dict[str, Any]:
    props = {
        "secretKeyRef": _open("A key of a Secret in the run's namespace.", name=_name(
            "The Secret's name (not a run's *-ray-token).")),
        "configMapKeyRef": _open("A key of a ConfigMap in the run's namespace."),
        "fieldRef": _open("A field of the pod (metadata.name, status.podIP, ...)."),
        "resourceFieldRef": _open("A resource limit or request of the container."),
    }
    assert tuple(props) == VALUE_FROM_KINDS
    return {"type": "object", "properties": props}


def _resources_schema() -> dict[str, Any]:
    """Closed: requests and limits, whose names CEL reads (rules.py); no dynamic resource claims."""
    def quantities(what: str) -> dict[str, Any]:
        return {"description": f"{what} of cpu, memory, ephemeral-storage and hugepages-* (GPUs: gpusPerReplica).",
                "type": "object", "maxProperties": MAX_RESOURCE_NAMES, "additionalProperties": {
                    "x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}}
    return {"type": "object", "properties": {"requests": quantities("Requests"), "limits": quantities("Limits")}}


def _type_schema(t: Any, info: FieldInfo | None = None) -> dict[str, Any]:
    origin = get_origin(t)
    if origin is typing.Annotated:
        base, *meta = get_args(t)
        s = _type_schema(base)
        if "volume-source" in meta:
            s = {"type": "object", "properties": volume_source_properties()}
        elif "value-from" in meta:
            s = _value_from_schema()
        elif "resources" in meta:
            s = _resources_schema()
        for m in meta:
            if isinstance(m, FieldInfo):
                _constraints(m, s)
        return s
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(t) if a is not type(None)]
        if len(args) == 1:
            return _type_schema(args[0], info)
        # "auto" | positive int: Kubernetes' int-or-string allows exactly this anyOf,
        # so the value checks move into a CEL rule on the field itself
        return {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-validations": [{
                "rule": "type(self) == string ? self == 'auto' : int(self) >= 1",
                "message": 'must be a positive integer or "auto"',
            }],
        }
    if origin is Literal:
        values = list(get_args(t))
        return {"type": "string", "enum": values}
    if origin is tuple:
        items = get_args(t)
        return {"type": "array", "items": _type_schema(items[0]), "minItems": len(items), "maxItems": len(items)}
    if origin is list:
        return {"type": "array", "items": _type_schema(get_args(t)[0])}
    if origin is dict:
        value = get_args(t)[1] if get_args(t) else Any
        if value is str or (get_origin(value) is typing.Annotated and get_args(value)[0] is str):
            return {"type": "object", "additionalProperties": _type_schema(value)}
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    if _is_model(t):
        return _object_schema(t)
    s = {int: {"type": "integer"}, float: {"type": "number"}, str: {"type": "string"}, bool: {"type": "boolean"}}.get(t)
    if s is None:
        raise TypeError(f"no OpenAPI mapping for {t!r}")
    return dict(s)


def _object_schema(model: type[BaseModel]) -> dict[str, Any]:
    props: dict[str, Any] = {}
    required: list[str] = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        # pydantic keeps a bare Annotated field's markers in its metadata, not its annotation.
        s = _resources_schema() if "resources" in info.metadata else _type_schema(info.annotation, info)
        _constraints(info, s)
        if s.get("type") == "integer" and "maximum" not in s:
            s["maximum"] = INT_MAX  # `validate` refuses the same (syntax.py)
        if info.description:
            s.pop("description", None)
            s = {"description": info.description, **s}
        if _is_model(info.annotation) and info.default_factory is not None:
            s["default"] = {}  # so the nested defaults apply when the block is left out
        elif info.is_required():
            required.append(key)
        elif info.default is not None and not callable(info.default_factory):
            d = info.default
            s["default"] = list(d) if isinstance(d, tuple) else d
        props[key] = s
    if model is ExtraVolume:
        props.update(volume_source_properties())  # closed: only the allowed sources
    out: dict[str, Any] = {"type": "object", "properties": props}
    if model.model_config.get("extra") == "allow" and model is not ExtraVolume:
        # Named fields plus whatever Kubernetes accepts there (a volume's source, say).
        out["x-kubernetes-preserve-unknown-fields"] = True
    if model.__doc__:
        out = {"description": model.__doc__.strip().splitlines()[0], **out}
    if required:
        out["required"] = required
    return out


def spec_schema() -> dict[str, Any]:
    """The OpenAPI v3 schema of .spec, with the cross-field rules as CEL."""
    s = _object_schema(RLRunSpec)
    s["x-kubernetes-validations"] = [
        {"rule": r.cel, "message": r.message, "fieldPath": "." + r.path, "reason": "FieldValueInvalid"} for r in RULES
    ]
    return s


def status_schema() -> dict[str, Any]:
    """Status is written by the operator only; its documented shape, open to additions."""
    cond = {
        "type": "object",
        "properties": {
            "type": {"type": "string"},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string"},
            "message": {"type": "string"},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer"},
        },
        "required": ["type", "status"],
    }
    return {
        "type": "object",
        "description": "Observed state, written by the rlscale operator.",
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "phase": {"type": "string", "enum": list(PHASES)},
            "observedGeneration": {"type": "integer"},
            "conditions": {
                "type": "array",
                "items": cond,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
            "plan": {
                "type": "object",
                "description": "The planner's choice and why (see `rlscale plan`).",
                "x-kubernetes-preserve-unknown-fields": True,
            },
            "progress": {
                "type": "object",
                "description": "Step, samples, reward, target metric, samples/s, time-to-target or ETA.",
                "x-kubernetes-preserve-unknown-fields": True,
            },
        },
    }


def crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{API_GROUP}",
            "labels": {"app.kubernetes.io/name": "rlscale", "app.kubernetes.io/part-of": "rlscale"},
        },
        "spec": {
            "group": API_GROUP,
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": SINGULAR,
                      "shortNames": SHORT_NAMES, "categories": ["rlscale"]},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": ("RLRun: an RL run (GRPO, PPO, RLOO, REINFORCE++, GSPO) whose batch, "
                                            "learning rate and rollout/learner split rlscale plans."),
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": status_schema(),
                            },
                            # Admission refuses a name the run's Services and labels cannot carry
                            # (CEL at the root may read metadata.name).
                            "x-kubernetes-validations": [{
                                "rule": f"self.metadata.name.matches('{RLRUN_NAME_RE}') && "
                                        f"size(self.metadata.name) <= {RLRUN_NAME_MAX}",
                                "message": f"metadata.name must be at most {RLRUN_NAME_MAX} characters of "
                                           "lowercase letters, digits and '-', starting with a letter and "
                                           "ending with a letter or digit (the run's Services and labels "
                                           "are named after it)",
                                "reason": "FieldValueInvalid",
                            }],
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `rlscale crd` from rlscale/spec/ (models.py, rules.py); do not edit by hand.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120)


def _type_name(s: dict[str, Any]) -> str:
    if s.get("x-kubernetes-int-or-string"):
        return 'int or "auto"'
    if "enum" in s:
        return " \\| ".join(str(v) for v in s["enum"])
    if s.get("type") == "array":
        return f"[{s['items']['type']}] x{s.get('maxItems', '')}"
    if s.get("type") == "object" and "properties" not in s:
        return "map"
    return s.get("type", "")


def spec_reference_markdown() -> str:
    """The spec reference table for the README, generated from the same schema as the CRD."""
    rows = ["| field | type | default | description |", "|---|---|---|---|"]

    sources = volume_source_properties()
    source_type = "volume source: " + " \\| ".join(VOLUME_SOURCES)

    def walk(schema: dict[str, Any], path: str) -> None:
        for key, sub in schema.get("properties", {}).items():
            p = f"{path}.{key}"
            if sub.get("properties") == sources:  # one row, not one per allowed source
                rows.append(f"| `{p}` | {source_type} | | {sub.get('description', '')} |")
                continue
            if sub.get("type") == "object" and "properties" in sub:
                rows.append(f"| **`{p}`** | object | | {sub.get('description', '')} |")
                walk(sub, p)
                continue
            d = sub.get("default")
            shown = "" if d is None else f"`{json_scalar(d)}`"
            rows.append(f"| `{p}` | {_type_name(sub)} | {shown} | {sub.get('description', '')} |")

    walk(spec_schema(), "spec")
    return "\n".join(rows) + "\n"


def json_scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(json_scalar(x) for x in v) + "]"
    return str(v)
