"""The admin's policy on the real control plane (issue 42, item 1): the operator, running with the policy
the tests allow (policykit), refuses a run that asks for more, a pod that asks for no GPU sees none, and a
run that names the admin's placement profile lands where the profile says (an unknown one is Invalid)."""

from __future__ import annotations

import pytest
from clusterkit import example_run, wait_for
from policykit import PINNED

from rlscale.operator import constants as C
from rlscale.operator.profiles import UNKNOWN_PROFILE

pytestmark = pytest.mark.cluster


def _failed(kube, name, ns, type_=C.COND_FAILED):
    r = kube.get("rlrun", name, ns) or {}
    return next((c for c in (r.get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def test_a_run_tolerating_a_taint_the_admin_did_not_allow_gets_nothing(kube, operator, ns):
    kube.apply(example_run("tainted", learner={"pod": {"tolerations": [
        {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]}}), ns)
    c = wait_for("NotAllowed", lambda: (f := _failed(kube, "tainted", ns)).get("reason") == "NotAllowed" and f)
    assert "spec.learner.pod.tolerations[0].key" in c["message"] and "policy.tolerationKeys" in c["message"]
    assert not kube.get("deployment", ns=ns, selector=f"{C.LABEL_RUN}=tainted")["items"]
    assert not kube.get("statefulset", ns=ns, selector=f"{C.LABEL_RUN}=tainted")["items"]


def test_the_ray_head_asks_for_no_gpu_and_sees_none(kube, operator, ns):
    kube.apply(example_run("heads"), ns)
    dep = wait_for("Ray head Deployment", lambda: kube.get("deployment", "heads-ray-head", ns))
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert not (c.get("resources") or {}).get("limits", {}).get(C.GPU_RESOURCE)
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"} in c["env"]


def test_a_run_naming_a_placement_profile_lands_where_the_profile_says(kube, operator, ns):
    # The profile's node label key and toleration key are in none of the tests' allowlists: it is the admin's.
    kube.apply(example_run("pinned", scheduling={"placementProfile": PINNED.name}), ns)

    def scheduled():
        pods = kube.get("pod", ns=ns, selector=f"{C.LABEL_RUN}=pinned")["items"]
        return pods if any(p["spec"].get("nodeName") for p in pods) else None

    pods = wait_for("a pod of the run scheduled", scheduled)
    (node,) = PINNED.node_selector.values()
    for p in pods:
        name = p["metadata"]["name"]
        assert p["spec"]["nodeSelector"] == PINNED.node_selector, name
        assert list(PINNED.tolerations) == [t for t in p["spec"]["tolerations"] if t in PINNED.tolerations], name
        assert p["spec"].get("nodeName") in (None, node), name  # the learners may wait for that node's GPUs


def test_a_run_naming_a_profile_the_cluster_lacks_is_invalid(kube, operator, ns):
    kube.apply(example_run("nowhere", scheduling={"placementProfile": "nowhere"}), ns)
    c = wait_for(UNKNOWN_PROFILE, lambda: (i := _failed(kube, "nowhere", ns, C.COND_INVALID)).get("reason")
                 == UNKNOWN_PROFILE and i)
    assert "spec.scheduling.placementProfile is 'nowhere'" in c["message"] and repr(PINNED.name) in c["message"]
    assert not kube.get("deployment", ns=ns, selector=f"{C.LABEL_RUN}=nowhere")["items"]
