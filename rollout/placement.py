"""Where the rollout replicas run, as the driver reports it to the operator (ordered scaling).

Each replica registers with the app's weight store when its construction starts, naming its pod
(POD_NAME, which the operator sets in every pod from the downward API), and again once it serves;
Serve calls its destructor at the end of a graceful stop, after its in-flight requests finished,
and the destructor unregisters it. So the pods the register names are the pods that host a replica
starting, serving or still draining, and every other rollout pod of the run hosts none: those are
the ones the operator may remove once the driver has scaled Serve down (docs/architecture.md,
"Ordered scaling").

A colocated run (plan.placement "colocated") has no rollout pods: each replica runs on a learner pod
(whose Ray node offers the `rollout` slot, operator/learner_pods.py) and registers that pod's name,
so the hosting pods are learner pods, which ordered scaling never removes (there is no rollout
Deployment to lower).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

POD_ENV = "POD_NAME"  # the pod's name (operator/builders.py _env), inherited by Ray's workers
SERVE_NAMESPACE = "serve"  # Serve's replica actors live in this Ray namespace, named by replica id


@dataclass(frozen=True)
class ServingState:
    """The rollout app as the driver sees it: the replica count it asked Serve for (`target`), the
    replicas by Serve state, and the pods hosting one (empty outside Kubernetes)."""

    target: int
    states: Mapping[str, int] = field(default_factory=dict)
    pods: tuple[str, ...] = ()

    @property
    def running(self) -> int:
        """Replicas that take requests now."""
        return int(self.states.get("RUNNING", 0))

    @property
    def drained(self) -> bool:
        """No replica beyond the target in any state (a removed one still draining counts)."""
        return sum(self.states.values()) <= self.target

    @property
    def settled(self) -> bool:
        """Exactly the target runs, and nothing starts or stops."""
        return dict(self.states) == {"RUNNING": self.target}


def here(actor_name: str | None) -> dict[str, Any]:
    """What a replica registers about where it runs: its pod (None outside Kubernetes) and the name
    of its Serve actor (None when constructed outside Serve)."""
    return {"pod": os.environ.get(POD_ENV) or None, "actor": actor_name}


def live(registered: Mapping[str, Mapping[str, Any]], actor_names: set[str] | None) -> dict[str, dict[str, Any]]:
    """The registered replicas whose Serve actor is still alive (`actor_names`: the live named actors
    of Serve's namespace; None: unknown, keep all). A replica whose process crashed stays registered
    (its destructor never ran); Ray drops a dead actor's name, so this leaves it out."""
    if actor_names is None:
        return {k: dict(v) for k, v in registered.items()}
    return {k: dict(v) for k, v in registered.items() if not v.get("actor") or v["actor"] in actor_names}


def serve_actor_names() -> set[str] | None:
    """The names of Serve's live actors (its replicas among them), or None when Ray cannot say."""
    import ray

    try:
        return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a.get("namespace") == SERVE_NAMESPACE}
    except Exception:  # the hosting pods are a report; never fail a step over them
        return None


def hosting_pods(registered: Mapping[str, Mapping[str, Any]]) -> tuple[str, ...]:
    """Sorted names of the pods hosting a registered replica."""
    return tuple(sorted({str(v["pod"]) for v in registered.values() if v.get("pod")}))
