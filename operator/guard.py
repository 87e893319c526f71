"""What the operator checks before it creates anything for a run, as pure functions: the images its pods
run (which the cluster admin's policy checks, operator/policy.py), the namespace's Pod Security label, and
that no object the run would own already exists under another owner. Each returns the refusal's
message (None: allowed); operator/reconcile.py turns it into the run's Failed condition."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

from rlscale.spec import RLRunSpec

from .builders import Images

# Refusal reasons that come from the cluster (its policy, its existing objects, its API server),
# not from the spec alone: they set the Failed condition, and clear once the cause is gone.
NOT_ALLOWED = "NotAllowed"
# A colocated plan runs vLLM in the learner pods. Operators before the trainer image carried vLLM
# refused such a run with the default images (this reason); the default trainer image (images/trainer)
# now has DeepSpeed and vLLM, so nothing sets it any more. It stays a cluster refusal so that a run an
# earlier operator failed with it is taken up again (its Failed condition clears) after the upgrade.
COLOCATED_IMAGE = "ColocatedNeedsImage"
NAMESPACE_NOT_ENFORCED = "NamespaceNotEnforced"
NAME_COLLISION = "NameCollision"
APPLY_REFUSED = "ApplyRefused"
CLUSTER_REFUSALS = frozenset({NOT_ALLOWED, NAMESPACE_NOT_ENFORCED, NAME_COLLISION, APPLY_REFUSED, COLOCATED_IMAGE})
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"


def images(spec: RLRunSpec, defaults: Images) -> list[tuple[str, str]]:
    """(field, image) of every container the run's pods run: the spec's, else the chart's default."""
    learner = ("spec.learner.image", spec.learner.image) if spec.learner.image else \
        ("spec.learner.image (unset: the chart value runImages.trainer)", defaults.trainer)
    rollout = ("spec.rollout.image", spec.rollout.image) if spec.rollout.image else \
        ("spec.rollout.image (unset: the chart value runImages.rollout)", defaults.rollout)
    # The Ray head runs the learner's image.
    return [learner, rollout]


def namespace_refusal(namespace: str, ns_obj: dict[str, Any] | None) -> str | None:
    """None when the namespace carries a Pod Security enforce label, else why the run waits."""
    labels = ((ns_obj or {}).get("metadata") or {}).get("labels") or {}
    if labels.get(PSA_ENFORCE):
        return None
    return (f"namespace {namespace} has no {PSA_ENFORCE} label, so nothing checks what the run's pods may do; "
            f"label it (kubectl label namespace {namespace} {PSA_ENFORCE}=restricted), or ask the cluster admin "
            "to set the rlscale chart value policy.requirePodSecurity to false")


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    """Whether the object names the RLRun of this uid among its owners."""
    return any(ref.get("uid") == uid for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


def collision_message(kind: str, namespace: str, name: str, run: str) -> str:
    return (f"{kind} {namespace}/{name} already exists and does not belong to this RLRun; the operator leaves it "
            f"alone and creates nothing for the run. Delete that {kind} if it is not needed, or create the run "
            f"under another name than {run!r} (its children are named {run}-<role>)")


def labels_reader(api: Any, namespace: str) -> Callable[[str, str], dict[str, str] | None]:
    """Reads the labels of a Secret or claim in the run's namespace, for the policy's secretLabel and
    claimLabel (operator/policy.py); None when it is absent or the operator may not read it (the chart
    grants `get` on Secrets or claims only where policy.secretLabel or claimLabel is set)."""
    def read(kind: str, name: str) -> dict[str, str] | None:
        try:
            obj = api.get("v1", kind, namespace, name)
        except ApiException as exc:
            if exc.status != 403:
                raise
            logging.getLogger("rlscale.operator").warning("%s %s/%s: the operator may not read it (%s)", kind,
                                                          namespace, name, exc.reason)
            return None
        return None if obj is None else dict((obj.get("metadata") or {}).get("labels") or {})
    return read
