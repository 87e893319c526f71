"""Runs queued in Kueue (spec.scheduling.queueName), against Kueue's own controller manager on
the test control plane: a run is admitted whole or waits with no pod at all, a suspended run
gives its quota back to the next one in the queue, and a resumed run waits for quota again.
And gang scheduling (spec.scheduling.podGroup) with scheduler-plugins' PodGroup API."""

from __future__ import annotations

import signal
import time

import pytest
from clusterkit import cp, example_run, wait_for
from kueuekit import Kueue

from rlscale.operator import builders as B
from rlscale.operator import constants as C

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

GPUS = 12  # the ClusterQueue's GPUs: one 8-GPU run fits, two do not


@pytest.fixture(scope="module")
def kueue(cluster, kube, operator, tmp_path_factory):
    k = Kueue(cluster, kube, tmp_path_factory.mktemp("kueue")).start()
    # The operator resolves the API's resources when it starts (it does not scan the cluster):
    # restarted after Kueue's CRDs exist, it watches Workloads, as after a real install.
    operator.kill(signal.SIGTERM)
    operator.start()
    kube.apply({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": C.KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": "default"}},
        {"apiVersion": C.KUEUE_API, "kind": "ClusterQueue", "metadata": {"name": "gpus"},
         "spec": {"namespaceSelector": {}, "resourceGroups": [{
             "coveredResources": ["cpu", "memory", C.GPU_RESOURCE],
             "flavors": [{"name": "default", "resources": [
                 {"name": "cpu", "nominalQuota": 1000}, {"name": "memory", "nominalQuota": "10Ti"},
                 {"name": C.GPU_RESOURCE, "nominalQuota": GPUS}]}]}]}}]})
    yield k
    k.stop()


def queued_run(name: str, ns: str) -> dict:
    """The GPU example at a fixed 8 GPUs (4 rollout replicas, 4 learner ranks), in LocalQueue team."""
    return example_run(name, scheduling={"queueName": "team"}, budget={"gpus": 8},
                       rollout={"replicas": 4, "maxReplicas": 4}, learner={"replicas": 4, "maxReplicas": 4})


def replicas(kube, run: str, ns: str) -> dict[str, int]:
    """Replicas each workload of the run asks for, and the run's pods that exist, by role."""
    out = {}
    for kind, role in (("deployment", C.ROLE_RAY_HEAD), ("deployment", C.ROLE_ROLLOUT),
                       ("statefulset", C.ROLE_LEARNER)):
        obj = kube.get(kind, B.names(run)[role], ns)
        out[role] = int(obj["spec"]["replicas"]) if obj else -1
    pods = kube.get("pods", ns=ns, selector=f"{C.LABEL_RUN}={run}")["items"]
    out["pods"] = len(pods)
    return out


def status(kube, run: str, ns: str) -> dict:
    return (kube.get("rlrun", run, ns) or {}).get("status") or {}


def admitted(st: dict) -> dict:
    return next((c for c in st.get("conditions") or [] if c["type"] == C.COND_ADMITTED), {})


def running(kube, run: str, ns: str) -> bool:
    r = replicas(kube, run, ns)
    return (r[C.ROLE_RAY_HEAD], r[C.ROLE_ROLLOUT], r[C.ROLE_LEARNER]) == (1, 4, 4) and r["pods"] == 9


def idle(kube, run: str, ns: str) -> bool:
    r = replicas(kube, run, ns)
    return r[C.ROLE_RAY_HEAD] == r[C.ROLE_ROLLOUT] == r[C.ROLE_LEARNER] == 0 and r["pods"] == 0


def test_a_queued_run_starts_only_when_kueue_admits_all_of_it(kube, operator, kueue, ns):
    kube.apply({"apiVersion": C.KUEUE_API, "kind": "LocalQueue", "metadata": {"name": "team"},
                "spec": {"clusterQueue": "gpus"}}, ns)
    # A: fits, so Kueue admits its Workload and every pod of it starts.
    kube.apply(queued_run("qa", ns), ns)
    wait_for("qa admitted and running", lambda: running(kube, "qa", ns), 90)
    wl = kube.get("workload", B.names("qa")[C.ROLE_QUEUE], ns)
    assert {p["name"]: p["count"] for p in wl["spec"]["podSets"]} == {"ray-head": 1, "rollout": 4, "learner": 4}
    assert wl["status"]["admission"]["clusterQueue"] == "gpus"
    st = wait_for("qa Running", lambda: (s := status(kube, "qa", ns)).get("phase") == C.PHASE_RUNNING and s, 60)
    assert admitted(st)["status"] == "True" and "ClusterQueue gpus" in admitted(st)["message"], st

    # B: 8 more GPUs do not fit in 12: it waits, Queued, with no pod and no partial start.
    kube.apply(queued_run("qb", ns), ns)
    wait_for("qb Queued", lambda: status(kube, "qb", ns).get("phase") == C.PHASE_QUEUED, 60)
    for _ in range(3):  # and stays so
        assert idle(kube, "qb", ns), replicas(kube, "qb", ns)
        assert running(kube, "qa", ns)
        time.sleep(3)
    assert admitted(status(kube, "qb", ns))["reason"] == "Queued"

    # Suspending A gives its quota back (inactive Workload, evicted, pods gone, reservation
    # released): Kueue admits B, which starts whole.
    kube.patch("rlrun", "qa", ns, {"spec": {"suspend": True}})
    wait_for("qa stopped", lambda: idle(kube, "qa", ns), 90)
    wait_for("qb admitted and running", lambda: running(kube, "qb", ns), 120)
    assert status(kube, "qa", ns).get("phase") == C.PHASE_SUSPENDED

    # Resumed, A queues again behind B: no pod until B is gone, then admitted whole again.
    kube.patch("rlrun", "qa", ns, {"spec": {"suspend": False}})
    wait_for("qa Queued again", lambda: status(kube, "qa", ns).get("phase") == C.PHASE_QUEUED, 60)
    assert idle(kube, "qa", ns) and running(kube, "qb", ns)
    kube.run("delete", "rlrun", "qb", "-n", ns, "--wait=false")
    wait_for("qa readmitted and running", lambda: running(kube, "qa", ns), 120)
    # The pass that scales the pods up writes the status after them: the condition follows.
    wait_for("qa's Admitted condition True", lambda: admitted(status(kube, "qa", ns)).get("status") == "True", 30)


def test_a_pod_group_holds_every_pod_of_the_run_or_the_run_says_what_is_missing(kube, operator, ns):
    spec = {"scheduling": {"podGroup": True, "schedulerName": "coscheduler"}}
    crd = cp.bin_dir() / "podgroup-crd.yaml"
    if kube.get("crd", "podgroups.scheduling.x-k8s.io") is None:
        # Without the PodGroup API the run is refused with the fix, and no pod is made.
        kube.apply(example_run("nogang", **spec), ns)
        st = wait_for("nogang Failed", lambda: (s := status(kube, "nogang", ns)).get("phase") == C.PHASE_FAILED
                      and s, 60)
        invalid = next(c for c in st["conditions"] if c["type"] == C.COND_INVALID)
        assert invalid["reason"] == "PodGroupUnavailable" and "scheduler-plugins" in invalid["message"], invalid
        assert kube.get("deployment", B.names("nogang")[C.ROLE_ROLLOUT], ns) is None
    kube.run("apply", "--server-side", "-f", str(crd))
    kube.wait("condition=Established", "-f", str(crd))
    kube.apply(example_run("gang", **spec), ns)
    pg = wait_for("the run's PodGroup", lambda: kube.get("podgroup", B.names("gang")[C.ROLE_GANG], ns), 60)
    plan = wait_for("gang planned", lambda: status(kube, "gang", ns).get("plan"), 60)
    assert pg["spec"]["minMember"] == 1 + plan["rolloutReplicas"] + plan["learnerReplicas"]
    # Every pod names the group and the gang scheduler (there is none here, so they wait).
    pods = wait_for("gang's pods", lambda: (p := kube.get("pods", ns=ns, selector=f"{C.LABEL_RUN}=gang")["items"])
                    and len(p) == pg["spec"]["minMember"] and p, 60)
    for p in pods:
        assert p["metadata"]["labels"][C.LABEL_POD_GROUP] == pg["metadata"]["name"]
        assert p["spec"]["schedulerName"] == "coscheduler" and not p["spec"].get("nodeName")
