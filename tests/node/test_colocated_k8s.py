"""A colocated run on the real node: the rollout engine inside the learner pod, its weights through vLLM's
weight transfer protocol with the `shm` backend (the CPU stand-in for ipc), for a bounded number of steps.

The trainer image carries vLLM, so the operator runs the engine in the learner pod (no rollout pod at all);
every step hands the node over (the engine sleeps, the learner trains and offloads, the engine wakes its
weights, takes the update from shared memory, wakes its KV cache), which on CPU is the same code with the
memory moves as no-ops."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from hack import cluster as cp
from hack.cluster import quickstart as qs
from rlscale.operator import builders as B
from rlscale.operator import constants as C
from tests.node.runs import RunView, wait

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1800)]

NS, RUN, STEPS = "colocated-e2e", "quickstart-colocated", 6
PSS = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"}


@dataclass
class Colocated:
    status: dict
    learner_log: str
    rollout_pods: int
    rollout_replicas: int
    # Seconds from `kubectl apply` to the first poll that saw each moment: where the run's time goes.
    timeline: dict[str, float] = field(default_factory=dict)


@pytest.fixture(scope="module")
def colocated(node_cluster, images, tmp_path_factory) -> Iterator[Colocated]:
    kubectl = node_cluster.kubectl
    qs.helm_install(cp.bin_dir() / "helm", node_cluster.kubeconfig)  # a no-op when another test installed it
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": NS, "labels": PSS}}))
    workdir = tmp_path_factory.mktemp("colocated")
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": qs.claims(
        NS, qs.model_cache(), workdir / "checkpoints")}))
    run = qs.quickstart(placement="colocated", rollout={"replicas": "auto"}, budget={"maxSteps": STEPS})
    run["metadata"]["name"] = RUN
    view = RunView(kubectl, NS, RUN)
    try:
        t0 = time.monotonic()
        kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(run))
        log = {"text": ""}
        pod = f"{B.names(RUN)[C.ROLE_LEARNER]}-0"
        rollout_pods = set()
        timeline: dict[str, float] = {}

        def seen(moment: str, now) -> None:  # now: a callable, called until the moment is seen
            if moment not in timeline and now():
                timeline[moment] = round(time.monotonic() - t0, 1)

        def ended():
            out = kubectl("logs", pod, "-c", C.ROLE_LEARNER, "-n", NS, check=False)
            if out.returncode == 0:
                log["text"] = out.stdout  # read while the pod lives: the log goes with it
            rollout_pods.update(p["metadata"]["name"] for p in view.pods(C.ROLE_ROLLOUT))
            seen("the Ray head ready", lambda: view.running(C.ROLE_RAY_HEAD))
            seen("the learner container started", lambda: out.returncode == 0)
            seen("the learner ready", lambda: view.running(C.ROLE_LEARNER))
            st = view.status()
            seen("the first step reported", lambda: int((st.get("progress") or {}).get("step") or 0) > 0)
            return st.get("phase") in (C.PHASE_BUDGET_EXHAUSTED, C.PHASE_SUCCEEDED, C.PHASE_FAILED)
        wait(f"{RUN} to end", ended, 900, 3)
        seen("the run ended", lambda: True)
        (workdir / "learner.log").write_text(log["text"])
        print(f"\ncolocated run, seconds after apply (polled every 3 s): {json.dumps(timeline)}", file=sys.stderr)
        deploy = view.get("deployment", B.names(RUN)[C.ROLE_ROLLOUT]) or {"spec": {"replicas": 0}}
        yield Colocated(view.status(), log["text"], len(rollout_pods), int(deploy["spec"].get("replicas") or 0),
                        timeline)
    finally:
        kubectl("delete", "namespace", NS, "--wait=false", check=False)


def test_a_colocated_run_takes_every_step_s_weights_through_shared_memory(colocated):
    st = colocated.status
    assert st.get("phase") in (C.PHASE_BUDGET_EXHAUSTED, C.PHASE_SUCCEEDED), json.dumps(st, indent=1)
    assert int(st["progress"]["step"]) >= STEPS or st["phase"] == C.PHASE_SUCCEEDED, st["progress"]
    log = colocated.learner_log
    print(f"\n{[x for x in log.splitlines() if ' by shm ' in x][-1:]}", file=sys.stderr)
    versions = {int(x.split("weights v", 1)[1].split()[0]) for x in log.splitlines() if " by shm to 1 replica" in x}
    assert len(versions) >= 3, log[-3000:]  # the first publish and the steps' own, each through vLLM's protocol
    assert colocated.rollout_pods == 0  # the engine ran in the learner pod


def test_the_plan_placed_the_engine_on_the_learner(colocated):
    plan = colocated.status.get("plan") or {}
    assert plan.get("placement") == "colocated", plan
