"""The cluster admin's policy (the chart's `policy` values): what an RLRun may reach beyond its own pods, denied
by default. Every list allows exactly what it names; an empty list allows none. Pure: the spec in, the first
refusal out (field, value and the chart value to set), which operator/reconcile.py turns into the run's Failed
condition (reason NotAllowed). The images checked include the defaults a run takes (the chart's runImages, or
those its status recorded when an older release started it): the chart's default imagePrefixes allow its own
registry."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rlscale.spec import RLRunSpec

from . import profiles as PR

ROLES = ("rollout", "learner")


@dataclass(frozen=True)
class Policy:
    """The allowlists; each field's chart value is CHART_VALUES[field]."""

    image_prefixes: tuple[str, ...] = ()  # matched on a path boundary: reg.example/ml allows reg.example/ml/x:1
    runtime_class_names: tuple[str, ...] = ()
    priority_class_names: tuple[str, ...] = ()  # system-node-critical and the rest only when named
    scheduler_names: tuple[str, ...] = ()
    toleration_keys: tuple[str, ...] = ()
    node_label_keys: tuple[str, ...] = ()  # nodeSelector keys, node affinity keys, pod affinity topology keys
    secret_names: tuple[str, ...] = ()  # Secrets a run's volumes, env and pull secrets may name
    claim_names: tuple[str, ...] = ()  # PersistentVolumeClaims a run's volumes may name
    # spec.scheduling.blockEvictions: PodDisruptionBudgets that allow no voluntary eviction of a training run
    allow_blocking_evictions: bool = False
    # Secrets and claims allowed by a label besides by name: "key=value", or "key" (any value); "" none.
    secret_label: str = ""
    claim_label: str = ""
    # Where runs go, by name (spec.scheduling.placementProfile; operator/profiles.py), and whether a run must
    # name one and set no node selector, toleration or affinity of its own.
    placement_profiles: tuple[PR.PlacementProfile, ...] = ()
    require_placement_profile: bool = False


CHART_VALUES = {"image_prefixes": "policy.imagePrefixes", "runtime_class_names": "policy.runtimeClassNames",
                "priority_class_names": "policy.priorityClassNames", "scheduler_names": "policy.schedulerNames",
                "toleration_keys": "policy.tolerationKeys", "node_label_keys": "policy.nodeLabelKeys",
                "secret_names": "policy.secretNames", "claim_names": "policy.claimNames",
                "allow_blocking_evictions": "policy.allowBlockingEvictions", "secret_label": "policy.secretLabel",
                "claim_label": "policy.claimLabel", "placement_profiles": PR.CHART_VALUE,
                "require_placement_profile": PR.REQUIRE_VALUE}
# An object's labels, by (kind, name) in the run's namespace; None when it cannot be read (absent).
Labels = Callable[[str, str], "dict[str, str] | None"]
_LABEL_OF = {"secret_names": ("secret_label", "Secret"), "claim_names": ("claim_label", "PersistentVolumeClaim")}


def label_matches(selector: str, labels: dict[str, str] | None) -> bool:
    """Whether `labels` carry the admin's label: "key=value", or "key" with any value."""
    if not selector or labels is None:
        return False
    key, eq, value = selector.partition("=")
    return key.strip() in labels and (not eq or labels[key.strip()] == value.strip())


def on_path_boundary(image: str, prefix: str) -> bool:
    """Whether `image` is `prefix` or lies under it: reg.example/ml allows reg.example/ml/x:1 and
    reg.example/ml:2, not reg.example/ml-other/x."""
    p = prefix.rstrip("/")
    return image == p or image.startswith((p + "/", p + ":", p + "@"))


def _refusal(what: str, field: str, value: str, allowed: tuple[str, ...], key: str) -> str:
    named = ", ".join(repr(a) for a in allowed) if allowed else "nothing (the list is empty)"
    return (f"{field} is {value!r}, which this cluster does not allow: its {what} allowlist has {named}; "
            f"use an allowed one, or ask the cluster admin to add it to the rlscale chart value {CHART_VALUES[key]}")


def _sources(spec: RLRunSpec) -> Iterator[tuple[str, dict[str, Any]]]:
    """(field, volume source) of every volume the spec names."""
    for field, src in (("spec.model.volume", spec.model.volume), ("spec.checkpoint.volume", spec.checkpoint.volume),
                       ("spec.task.pluginVolume", spec.task.plugin_volume)):
        if src:
            yield field, src
    for role in ROLES:
        for i, v in enumerate(getattr(spec, role).pod.volumes):
            yield f"spec.{role}.pod.volumes[{i}]", dict(v.model_extra or {})


def secrets(spec: RLRunSpec) -> Iterator[tuple[str, str]]:
    """(field, name) of every Secret the spec names: volumes, projections, env and pull secrets."""
    for field, src in _sources(spec):
        if isinstance(src.get("secret"), dict) and src["secret"].get("secretName"):
            yield f"{field}.secret.secretName", src["secret"]["secretName"]
        for j, p in enumerate((src.get("projected") or {}).get("sources") or []):
            if isinstance(p, dict) and isinstance(p.get("secret"), dict) and p["secret"].get("name"):
                yield f"{field}.projected.sources[{j}].secret.name", p["secret"]["name"]
    for role in ROLES:
        pod = getattr(spec, role).pod
        for i, e in enumerate(pod.env):
            ref = (e.value_from or {}).get("secretKeyRef")
            if isinstance(ref, dict) and ref.get("name"):
                yield f"spec.{role}.pod.env[{i}].valueFrom.secretKeyRef.name", ref["name"]
        for i, name in enumerate(pod.image_pull_secrets):
            yield f"spec.{role}.pod.imagePullSecrets[{i}]", name


def claims(spec: RLRunSpec) -> Iterator[tuple[str, str]]:
    """(field, name) of every PersistentVolumeClaim the spec's volumes name."""
    for field, src in _sources(spec):
        pvc = src.get("persistentVolumeClaim")
        if isinstance(pvc, dict) and pvc.get("claimName"):
            yield f"{field}.persistentVolumeClaim.claimName", pvc["claimName"]


def _node_keys(affinity: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(path under affinity, key) of every node label key the affinity reads."""
    node = affinity.get("nodeAffinity") or {}
    terms = [("requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms", t) for t in
             ((node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])]
    terms += [("preferredDuringSchedulingIgnoredDuringExecution.preference", p.get("preference") or {})
              for p in node.get("preferredDuringSchedulingIgnoredDuringExecution") or [] if isinstance(p, dict)]
    for where, term in terms:
        for kind in ("matchExpressions", "matchFields"):
            for e in (term or {}).get(kind) or []:
                yield f"nodeAffinity.{where}.{kind}.key", str((e or {}).get("key"))


def _pod_terms(affinity: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for kind in ("podAffinity", "podAntiAffinity"):
        a = affinity.get(kind) or {}
        for t in a.get("requiredDuringSchedulingIgnoredDuringExecution") or []:
            yield f"{kind}.requiredDuringSchedulingIgnoredDuringExecution", t or {}
        for t in a.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
            yield f"{kind}.preferredDuringSchedulingIgnoredDuringExecution", (t or {}).get("podAffinityTerm") or {}


def _placement(spec: RLRunSpec, policy: Policy) -> str | None:
    """Tolerations, node selectors and affinity: a run lands only where the admin's keys say."""
    for role in ROLES:
        pod, base = getattr(spec, role).pod, f"spec.{role}.pod"
        for i, t in enumerate(pod.tolerations):
            key = (t or {}).get("key") or ""
            if not key:
                return (f"{base}.tolerations[{i}] has no key, so it tolerates every taint (control-plane nodes, "
                        "other teams' pools); name the taint's key (allowed: "
                        + (", ".join(policy.toleration_keys) or "none") + ")")
            if key not in policy.toleration_keys:
                return _refusal("toleration key", f"{base}.tolerations[{i}].key", key, policy.toleration_keys,
                                "toleration_keys")
        for key in pod.node_selector:
            if key not in policy.node_label_keys:
                return _refusal("node label key", f"{base}.nodeSelector", key, policy.node_label_keys,
                                "node_label_keys")
        for where, key in _node_keys(pod.affinity):
            if key not in policy.node_label_keys:
                return _refusal("node label key", f"{base}.affinity.{where}", key, policy.node_label_keys,
                                "node_label_keys")
        for where, term in _pod_terms(pod.affinity):
            if term.get("namespaces") or term.get("namespaceSelector") is not None:
                return (f"{base}.affinity.{where} looks at pods of other namespaces (namespaces, namespaceSelector); "
                        "a run's affinity may name its own namespace's pods only: remove them")
            key = str(term.get("topologyKey"))
            if key not in policy.node_label_keys:
                return _refusal("node label key", f"{base}.affinity.{where}.topologyKey", key,
                                policy.node_label_keys, "node_label_keys")
    return None


def _names(spec: RLRunSpec) -> Iterator[tuple[str, str, str]]:
    """(policy field, spec field, value) of every class and scheduler name the spec asks for."""
    s = spec.scheduling
    if s.priority_class_name:
        yield "priority_class_names", "spec.scheduling.priorityClassName", s.priority_class_name
    if s.scheduler_name:
        yield "scheduler_names", "spec.scheduling.schedulerName", s.scheduler_name
    box = spec.task.tool_sandbox
    if box is not None and box.isolation == "pod" and box.runtime_class_name:
        yield "runtime_class_names", "spec.task.toolSandbox.runtimeClassName", box.runtime_class_name
    for role in ROLES:
        pod = getattr(spec, role).pod
        if pod.priority_class_name:
            yield "priority_class_names", f"spec.{role}.pod.priorityClassName", pod.priority_class_name
        if pod.runtime_class_name:
            yield "runtime_class_names", f"spec.{role}.pod.runtimeClassName", pod.runtime_class_name


_WHAT = {"priority_class_names": "PriorityClass", "scheduler_names": "scheduler", "runtime_class_names":
         "RuntimeClass", "secret_names": "Secret", "claim_names": "PersistentVolumeClaim"}


def refusal(spec: RLRunSpec, images: list[tuple[str, str]], policy: Policy,
            labels: Labels | None = None) -> str | None:
    """The first thing of the run the policy does not allow, or None. `images`: (field, image) of every
    container (operator/guard.py images()). `labels`: reads a Secret's or claim's labels, for those the
    policy allows by label (secretLabel, claimLabel) rather than by name."""
    for field, image in images:
        if not any(on_path_boundary(image, p) for p in policy.image_prefixes):
            return _refusal("image prefix", field, image, policy.image_prefixes, "image_prefixes")
    for key, field, value in _names(spec):
        if value not in getattr(policy, key):
            return _refusal(_WHAT[key], field, value, getattr(policy, key), key)
    # The run's own placement: what its profile (or the admin's requirement of one) refuses, then the allowlists.
    if msg := PR.refusal(spec, policy.placement_profiles, policy.require_placement_profile):
        return msg
    if msg := _placement(spec, policy):
        return msg
    if spec.scheduling.block_evictions and not policy.allow_blocking_evictions:
        return ("spec.scheduling.blockEvictions is true, which this cluster does not allow (it would keep node "
                "drains waiting on the run): leave it false (one eviction at a time, the ranks resume from the last "
                "checkpoint), or ask the cluster admin to set the rlscale chart value "
                + CHART_VALUES["allow_blocking_evictions"])
    for key, refs in (("secret_names", secrets(spec)), ("claim_names", claims(spec))):
        label_key, kind = _LABEL_OF[key]
        selector = getattr(policy, label_key)
        for field, name in refs:
            if name in getattr(policy, key):
                continue
            if selector and labels is not None and label_matches(selector, labels(kind, name)):
                continue
            msg = _refusal(_WHAT[key], field, name, getattr(policy, key), key)
            if selector:
                msg += f", or label the {kind} {selector} ({CHART_VALUES[label_key]})"
            return msg
    return None
