"""Names and metadata every child of an RLRun carries: the owning run (RunRef), the children's names
by role, their labels, and the metadata (owner reference included) the builders stamp on each."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from . import constants as C

# Room left for what controllers append (StatefulSet pod ordinals, revision hashes).
_MAX_BASE = 52


@dataclass(frozen=True)
class RunRef:
    """The RLRun that owns the children: enough for names and owner references."""

    name: str
    namespace: str
    uid: str
    api_version: str = f"{C.GROUP}/{C.VERSION}"

    def owner_reference(self) -> dict[str, Any]:
        # controller=true marks the one owner; the garbage collector deletes children with it.
        return {"apiVersion": self.api_version, "kind": C.RLRUN_KIND, "name": self.name,
                "uid": self.uid, "controller": True, "blockOwnerDeletion": True}


def child_name(run: str, suffix: str) -> str:
    """`<run>-<suffix>`, shortened with a stable hash when it would not fit a DNS label."""
    if len(run) + 1 + len(suffix) <= _MAX_BASE:
        return f"{run}-{suffix}"
    h = hashlib.sha256(run.encode()).hexdigest()[:6]
    keep = _MAX_BASE - len(suffix) - len(h) - 2
    return f"{run[:keep].rstrip('-')}-{h}-{suffix}"


def names(run: str) -> dict[str, str]:
    """Every child's name by role."""
    return {
        C.ROLE_CONFIG: child_name(run, "config"),
        C.ROLE_RAY_HEAD: child_name(run, "ray-head"),
        C.ROLE_ROLLOUT: child_name(run, "rollout"),
        C.ROLE_LEARNER: child_name(run, "learner"),
        C.ROLE_METRICS: child_name(run, "metrics"),
        C.ROLE_RUNNER: child_name(run, "runner"),
        C.ROLE_TOKEN: child_name(run, "ray-token"),
        C.ROLE_NETWORK: child_name(run, "network"),
        C.ROLE_QUEUE: child_name(run, "queue"),
        C.ROLE_GANG: child_name(run, "gang"),
        C.ROLE_TOOLS: child_name(run, "tools"),
    }


def labels(run: str, role: str) -> dict[str, str]:
    return {C.LABEL_RUN: run, C.LABEL_ROLE: role, C.LABEL_MANAGED_BY: C.MANAGED_BY}


def object_meta(run: RunRef, name: str, role: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta = {"name": name, "namespace": run.namespace, "labels": labels(run.name, role),
            "ownerReferences": [run.owner_reference()]}
    if annotations:
        meta["annotations"] = annotations
    return meta
