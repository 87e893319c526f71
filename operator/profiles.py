"""Placement profiles (the chart's `policy.placementProfiles`): where a cluster admin says where runs go,
Kueue-style, so that a run names a profile (`spec.scheduling.placementProfile`) instead of nodes.

A profile is the admin's: its node selector, tolerations, affinity, priority class, scheduler, runtime class
and Kueue queue are not checked against the policy's allowlists (operator/policy.py), which hold a run's own
fields. A run adds to its profile and never overrides it: its own node selector keys, tolerations and
affinity terms (allowlisted) join the profile's, and a single value the profile sets (a node selector key, a
class, the scheduler, the queue) the run may not set too. `policy.requirePlacementProfile` makes a profile
the only way: a run must name one and set no node selector, toleration or affinity of its own.

Pure: parsing the chart's JSON (a bad value names itself), the refusals (operator/reconcile.py: an unknown
profile is Invalid, the rest NotAllowed) and the effective spec the builders build the pods from."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from rlscale.spec import RLRunSpec
from rlscale.spec import syntax as X
from rlscale.spec.models import DNS1123_RE

CHART_VALUE = "policy.placementProfiles"
REQUIRE_VALUE = "policy.requirePlacementProfile"
UNKNOWN_PROFILE = "UnknownPlacementProfile"  # the Invalid condition's reason
_ROLES = ("rollout", "learner")
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_AFFINITY_KINDS = ("nodeAffinity", "podAffinity", "podAntiAffinity")
# A profile's single-valued fields: (its chart key, its attribute).
_SINGLE = (("priorityClassName", "priority_class_name"), ("schedulerName", "scheduler_name"),
           ("runtimeClassName", "runtime_class_name"), ("queueName", "queue_name"))


@dataclass(frozen=True)
class PlacementProfile:
    """One profile, as the chart's values name its fields (camelCase in the chart, snake_case here)."""

    name: str
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    affinity: dict[str, Any] = field(default_factory=dict)
    priority_class_name: str = ""
    scheduler_name: str = ""
    runtime_class_name: str = ""
    queue_name: str = ""  # a Kueue LocalQueue in the run's namespace

    def to_values(self) -> dict[str, Any]:
        """The profile as the chart's values write it (what parse_profiles reads back)."""
        out: dict[str, Any] = {k: v for k, v in (("nodeSelector", self.node_selector),
                                                  ("tolerations", list(self.tolerations)),
                                                  ("affinity", self.affinity)) if v}
        out.update({key: getattr(self, attr) for key, attr in _SINGLE if getattr(self, attr)})
        return out


def to_json(profiles: tuple[PlacementProfile, ...]) -> str:
    """The profiles as the chart renders them into the operator's environment (toJson of the values)."""
    return json.dumps({p.name: p.to_values() for p in profiles}, sort_keys=True)


def _bad(where: str, value: Any, problem: str) -> ValueError:
    return ValueError(f"{CHART_VALUE}{where} is {json.dumps(value)[:200]}: {problem}; fix the rlscale chart value "
                      f"{CHART_VALUE} (docs/security.md, \"Placement profiles\")")


def _name(where: str, value: Any, pattern: str, limit: int) -> str:
    if not isinstance(value, str) or len(value) > limit or not X.full(pattern, value):
        raise _bad(where, value, f"not a Kubernetes name (lower-case letters, digits and '-', at most {limit})")
    return value


def _one(name: str, values: Any) -> PlacementProfile:
    where = f".{name}"
    _name(where, name, DNS1123_RE, X.DNS_LABEL_MAX)  # as spec.scheduling.placementProfile takes it
    values = values or {}
    if not isinstance(values, dict):
        raise _bad(where, values, "a profile is an object of nodeSelector, tolerations, affinity, "
                   + ", ".join(k for k, _ in _SINGLE))
    known = {"nodeSelector", "tolerations", "affinity", *(k for k, _ in _SINGLE)}
    if unknown := sorted(set(values) - known):
        raise _bad(f"{where}.{unknown[0]}", values[unknown[0]], "not a profile field (it takes "
                   + ", ".join(sorted(known)) + ")")
    sel = values.get("nodeSelector") or {}
    if not isinstance(sel, dict):
        raise _bad(f"{where}.nodeSelector", sel, "an object of node label keys to values")
    for k, v in sel.items():
        if X.key_problem(k) or not isinstance(v, str) or len(v) > X.DNS_LABEL_MAX or not X.full(X.LABEL_VALUE_RE, v):
            raise _bad(f"{where}.nodeSelector.{k}", v, "not a valid node label key and value")
    tol = values.get("tolerations") or []
    if not isinstance(tol, list) or not all(isinstance(t, dict) for t in tol):
        raise _bad(f"{where}.tolerations", tol, "a list of tolerations (objects with key, operator, value, effect)")
    aff = values.get("affinity") or {}
    if not isinstance(aff, dict) or not all(k in _AFFINITY_KINDS and isinstance(v, dict) for k, v in aff.items()):
        raise _bad(f"{where}.affinity", aff, "an object of " + ", ".join(_AFFINITY_KINDS))
    single = {}
    for key, attr in _SINGLE:
        if values.get(key):
            queue = key == "queueName"  # a LocalQueue's name is a DNS label, the rest DNS subdomains
            single[attr] = _name(f"{where}.{key}", values[key], DNS1123_RE if queue else X.DNS_SUBDOMAIN_RE,
                                 X.DNS_LABEL_MAX if queue else X.DNS_SUBDOMAIN_MAX)
    return PlacementProfile(name, dict(sel), tuple(copy.deepcopy(tol)), copy.deepcopy(aff), **single)


def parse_profiles(text: str) -> tuple[PlacementProfile, ...]:
    """The profiles from the chart's JSON (an object of name to profile; "" or null: none). A bad one raises
    ValueError naming the chart value, the field and the fix: the operator does not start on it."""
    if not text.strip():
        return ()
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{CHART_VALUE} does not read as JSON ({exc}); fix the rlscale chart value "
                         f"{CHART_VALUE}") from None
    if data is None:
        return ()
    if not isinstance(data, dict):
        raise _bad("", data, "an object of profile name to profile")
    return tuple(_one(name, values) for name, values in sorted(data.items()))


def find(profiles: tuple[PlacementProfile, ...], name: str | None) -> PlacementProfile | None:
    return next((p for p in profiles if p.name == name), None) if name else None


def _listed(profiles: tuple[PlacementProfile, ...]) -> str:
    return ", ".join(repr(p.name) for p in profiles) if profiles else "none"


def unknown(spec: RLRunSpec, profiles: tuple[PlacementProfile, ...]) -> str | None:
    """Why the run's profile is not one the cluster defines (the run is Invalid), or None."""
    name = spec.scheduling.placement_profile
    if not name or find(profiles, name) is not None:
        return None
    return (f"spec.scheduling.placementProfile is {name!r}, which this cluster does not define: its placement "
            f"profiles are {_listed(profiles)} (the rlscale chart value {CHART_VALUE}); name one of them, or ask "
            "the cluster admin to define it")


def refusal(spec: RLRunSpec, profiles: tuple[PlacementProfile, ...], require: bool) -> str | None:
    """What of the run's own placement its profile, or the admin's requirement of one, does not allow; None
    when nothing. An unknown profile is unknown()'s."""
    name = spec.scheduling.placement_profile
    if require and not name:
        return (f"spec.scheduling.placementProfile is unset, but this cluster places runs through placement "
                f"profiles only (the rlscale chart value {REQUIRE_VALUE}): name one of {_listed(profiles)}")
    p = find(profiles, name)
    for role in _ROLES:
        pod, base = getattr(spec, role).pod, f"spec.{role}.pod"
        if require:
            for key, value in (("nodeSelector", pod.node_selector), ("tolerations", pod.tolerations),
                               ("affinity", pod.affinity)):
                if value:
                    return (f"{base}.{key} is set, but this cluster places runs through placement profiles only "
                            f"(the rlscale chart value {REQUIRE_VALUE}): remove it; the profile {name!r} says "
                            "where the pods go (ask the cluster admin for another profile if it does not fit)")
        if p is None:
            continue
        if clash := next((k for k in pod.node_selector if k in p.node_selector), None):
            return _clash(f"{base}.nodeSelector.{clash}", pod.node_selector[clash], p, f"nodeSelector.{clash}",
                          p.node_selector[clash])
        for key, attr in (("priorityClassName", "priority_class_name"), ("runtimeClassName", "runtime_class_name")):
            if getattr(p, attr) and getattr(pod, attr):
                return _clash(f"{base}.{key}", getattr(pod, attr), p, key, getattr(p, attr))
    for key, attr in (("priorityClassName", "priority_class_name"), ("schedulerName", "scheduler_name"),
                      ("queueName", "queue_name")):
        if p is not None and getattr(p, attr) and getattr(spec.scheduling, attr):
            return _clash(f"spec.scheduling.{key}", getattr(spec.scheduling, attr), p, key, getattr(p, attr))
    return None


def _clash(field_: str, value: str, p: PlacementProfile, key: str, theirs: str) -> str:
    return (f"{field_} is {value!r}, but the placement profile {p.name!r} sets {key} to {theirs!r}: a run adds to "
            f"its profile and never overrides it; remove {field_}, or name another profile ({CHART_VALUE})")


def _and_terms(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Node selector terms that hold where a term of `a` and a term of `b` both hold (each list is ORed,
    a term's expressions ANDed): every pair, its expressions joined."""
    if not a or not b:
        return copy.deepcopy(a or b)
    out = []
    for x in a:
        for y in b:
            term = {k: [*(x.get(k) or []), *(y.get(k) or [])] for k in ("matchExpressions", "matchFields")}
            out.append(copy.deepcopy({k: v for k, v in term.items() if v}))
    return out


def merge_affinity(profile: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """The profile's affinity with the run's added: required node terms must both hold (their product),
    every other list (preferred terms, pod (anti-)affinity terms, each of which must hold) is joined."""
    out = copy.deepcopy(profile)
    for kind, section in (own or {}).items():
        dst = out.setdefault(kind, {})
        for when, value in (section or {}).items():
            if when not in dst:
                dst[when] = copy.deepcopy(value)
            elif kind == "nodeAffinity" and when == _REQUIRED:
                dst[when] = {"nodeSelectorTerms": _and_terms(dst[when].get("nodeSelectorTerms") or [],
                                                             (value or {}).get("nodeSelectorTerms") or [])}
            else:
                dst[when] = [*dst[when], *copy.deepcopy(value or [])]
    return out


def effective(spec: RLRunSpec, profiles: tuple[PlacementProfile, ...]) -> RLRunSpec:
    """The spec the run's pods are built from: its profile's placement with the run's own added (the spec
    as it is when it names none, or one the cluster does not define). The profile's priority class,
    scheduler and queue go to spec.scheduling (every pod of the run, the Ray head's too, and the run's
    Kueue Workload); its node selector, tolerations, affinity and runtime class to each role's pod (the Ray
    head takes the learner's placement: operator/pods.py)."""
    p = find(profiles, spec.scheduling.placement_profile)
    if p is None:
        return spec
    sched = {attr: getattr(p, attr) for attr in ("priority_class_name", "scheduler_name", "queue_name")
             if getattr(p, attr)}
    roles = {}
    for role in _ROLES:
        rs = getattr(spec, role)
        pod = {"node_selector": {**p.node_selector, **rs.pod.node_selector},
               "tolerations": [*copy.deepcopy(list(p.tolerations)), *rs.pod.tolerations],
               "affinity": merge_affinity(p.affinity, rs.pod.affinity)}
        if p.runtime_class_name:
            pod["runtime_class_name"] = p.runtime_class_name
        roles[role] = rs.model_copy(update={"pod": rs.pod.model_copy(update=pod)})
    return spec.model_copy(update={"scheduling": spec.scheduling.model_copy(update=sched), **roles})
