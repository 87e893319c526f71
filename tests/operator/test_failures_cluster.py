"""Failures the restart count never sees, on the real control plane (issue 42, item 5): a pod that cannot
pull its image (kwok plays the kubelet: hack/cluster/kwok-stages.yaml holds registry.example/unpullable:0
in ImagePullBackOff) ends the run past its start deadline, and an eviction through the Eviction API (the
PodDisruptionBudget allows one at a time) counts against the run's budget, ending it once none is left."""

from __future__ import annotations

import json

import pytest
from clusterkit import example_run, wait_for

from rlscale.operator import builders as B
from rlscale.operator import constants as C

pytestmark = pytest.mark.cluster

UNPULLABLE = "registry.example/unpullable:0"


def _status(kube, name, ns):
    return (kube.get("rlrun", name, ns) or {}).get("status") or {}


def _failed(kube, name, ns):
    return next((c for c in _status(kube, name, ns).get("conditions", []) if c["type"] == C.COND_FAILED), {})


def _events(kube, name, ns):
    return [e for e in kube.get("events", ns=ns)["items"] if e["involvedObject"].get("name") == name]


def _replicas(kube, name, ns):
    n = B.names(name)
    return [(kube.get(kind, n[role], ns) or {}).get("spec", {}).get("replicas")
            for kind, role in (("deployment", C.ROLE_ROLLOUT), ("statefulset", C.ROLE_LEARNER))]


def test_a_pod_that_cannot_pull_its_image_ends_the_run_with_that_reason(kube, operator, ns):
    kube.apply(example_run("unpulled", learner={"image": UNPULLABLE},
                           failurePolicy={"podStartTimeoutSeconds": 5}), ns)
    f = wait_for("Failed ImagePullBackOff", lambda: (x := _failed(kube, "unpulled", ns)).get("status") == "True" and x,
                 timeout=60)
    assert f["reason"] == "ImagePullBackOff", f
    assert f'Back-off pulling image "{UNPULLABLE}"' in f["message"]
    assert "past spec.failurePolicy.podStartTimeoutSeconds (5)" in f["message"]
    assert _status(kube, "unpulled", ns)["phase"] == C.PHASE_FAILED
    wait_for("workloads at zero", lambda: _replicas(kube, "unpulled", ns) == [0, 0])
    assert "ImagePullBackOff" in [e["reason"] for e in _events(kube, "unpulled", ns)]


def _evict(kube, ns, pod):
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": ns}}
    return kube.run("create", "--raw", f"/api/v1/namespaces/{ns}/pods/{pod}/eviction", "-f", "-",
                    input=json.dumps(body), check=False)


def _evictable(kube, name, ns):
    """Rank 0 Running and its budget allowing an eviction (the disruption controller has counted it)."""
    n = B.names(name)
    pdb = kube.get("poddisruptionbudget", n[C.ROLE_LEARNER], ns) or {}
    pod = kube.get("pod", f"{n[C.ROLE_LEARNER]}-0", ns) or {}
    return ((pdb.get("status") or {}).get("disruptionsAllowed", 0) >= 1
            and (pod.get("status") or {}).get("phase") == "Running" and pod["metadata"]["uid"])


def test_an_evicted_rank_counts_against_the_budget_and_past_it_ends_the_run(kube, operator, ns):
    kube.apply(example_run("evicted", failurePolicy={"backoffLimit": 1}), ns)
    rank0 = f"{B.names('evicted')[C.ROLE_LEARNER]}-0"
    first = wait_for("rank 0 evictable", lambda: _evictable(kube, "evicted", ns), timeout=60)
    out = _evict(kube, ns, rank0)
    assert out.returncode == 0, out.stderr  # the default budget allows one eviction
    faults = wait_for("fault counted", lambda: (x := _status(kube, "evicted", ns).get("faults") or {})
                      .get("count") == 1 and x)
    assert f"pod {rank0} evicted (EvictionByEvictionAPI" in faults["lastCause"]
    assert _failed(kube, "evicted", ns).get("status") != "True"
    event = next(e for e in _events(kube, "evicted", ns) if e["reason"] == "FaultCounted")
    assert "fault 1 of the 1 spec.failurePolicy.backoffLimit allows" in event["message"]
    # The StatefulSet's new rank 0, evicted in turn: a second fault, past the limit.
    wait_for("new rank 0 evictable", lambda: (uid := _evictable(kube, "evicted", ns)) and uid != first, timeout=60)
    assert _evict(kube, ns, rank0).returncode == 0
    f = wait_for("Failed", lambda: (x := _failed(kube, "evicted", ns)).get("status") == "True" and x)
    assert f["reason"] == "BackoffLimitExceeded", f
    assert f["message"].startswith(f"2 faults (the last: pod {rank0} evicted (EvictionByEvictionAPI")
    wait_for("workloads at zero", lambda: _replicas(kube, "evicted", ns) == [0, 0])
