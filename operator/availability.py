"""What a run's pods promise about being available: the readiness probe of each role, and the
PodDisruptionBudgets that keep voluntary evictions (a node drain, the cluster autoscaler) from
breaking a training run. Pure builders, like operator/builders.py, which adds both to the children.

Readiness means the role can do its work, so RolloutReady and LearnersReady (from the workloads'
readyReplicas) say more than "started":

- the Ray head is ready when its GCS answers a gRPC health check on the GCS port (the GCS serves
  grpc.health.v1 without the run's token; every other call needs it);
- a rollout pod is ready when the Serve replica on it has loaded its engine and the newest weights
  and registered (GET /ready on the metrics port, served by the replica's own process);
- a learner rank is ready while it takes part in the training: torch.distributed initialised, the
  DeepSpeed engine built, every rank past the start barrier (GET /ready on the metrics port, served
  by the rank's process from its start; a rank that exits for a gang restart answers nothing, and
  its restarted process answers 503 until it has joined again).

Readiness probes only: a slow start (a model built into an empty volume, vLLM's compile) makes a
pod wait, never restart.
"""

from __future__ import annotations

from typing import Any

from rlscale.spec import RLRunSpec

from . import constants as C
from .naming import RunRef, names, object_meta

PROBE_PERIOD_S = 5
# A role's process answers from a thread beside its work (a busy 2-core node, a Python step):
# three missed answers of 3 s each before a ready pod counts as not ready.
PROBE_TIMEOUT_S = 3
PROBE_FAILURES = 3

# Voluntary evictions allowed per role while the run trains: one pod at a time, never none by default
# (a budget of none lets any tenant block every drain, and Kyverno's common pdb-maxunavailable policy
# refuses it, so no run could start). Evicting the Ray head or a learner rank restarts every rank from
# the last checkpoint (a learner rank's loss is a gang restart; the head's makes rank 0 rejoin a new Ray
# cluster): one such gang eviction at a time, counted against spec.failurePolicy.backoffLimit
# (operator/faults.py). Rollout pods are replaceable one at a time: Serve re-places a lost replica on
# the Deployment's new pod. spec.scheduling.blockEvictions (where the admin's policy allows it) keeps
# the head and the ranks from any voluntary eviction while the run trains.
MAX_UNAVAILABLE = {C.ROLE_RAY_HEAD: 1, C.ROLE_LEARNER: 1, C.ROLE_ROLLOUT: 1}
BLOCKING = {C.ROLE_RAY_HEAD: 0, C.ROLE_LEARNER: 0, C.ROLE_ROLLOUT: 1}
# While a run is suspended or has ended nothing is lost by an eviction (the head stays up while
# suspended): the budgets then allow every pod to go, so a drain never waits on a run that is not
# training.
ANY = "100%"


def readiness_probe(role: str) -> dict[str, Any]:
    """The role's container readinessProbe (no liveness or startup probe: see the module)."""
    if role == C.ROLE_RAY_HEAD:
        action: dict[str, Any] = {"grpc": {"port": C.RAY_GCS_PORT}}
    else:
        action = {"httpGet": {"path": C.READY_PATH, "port": "metrics", "scheme": "HTTP"}}
    return {**action, "periodSeconds": PROBE_PERIOD_S, "timeoutSeconds": PROBE_TIMEOUT_S,
            "failureThreshold": PROBE_FAILURES, "successThreshold": 1}


def build_disruption_budgets(run: RunRef, spec: RLRunSpec, finished: bool = False) -> list[dict[str, Any]]:
    """One PodDisruptionBudget per role, named like its workload. Pods that are not Ready may
    always be evicted (unhealthyPodEvictionPolicy AlwaysAllow): a rank waiting to rejoin, a
    crash-looping pod or a replica still loading holds no training state a drain could break, so a
    broken run never blocks a drain. A drain evicts one learner rank at a time: the ranks restart
    together from the last checkpoint. To drain without that, suspend the run first (spec.suspend:
    true): rank 0 checkpoints, the workloads scale down and the budgets open."""
    training = not (finished or spec.suspend)
    budget = BLOCKING if spec.scheduling.block_evictions else MAX_UNAVAILABLE
    out = []
    for role in (C.ROLE_RAY_HEAD, C.ROLE_ROLLOUT, C.ROLE_LEARNER):
        out.append({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": object_meta(run, names(run.name)[role], role),
            "spec": {"selector": {"matchLabels": {C.LABEL_RUN: run.name, C.LABEL_ROLE: role}},
                     "maxUnavailable": budget[role] if training else ANY,
                     "unhealthyPodEvictionPolicy": "AlwaysAllow"},
        })
    return out
