"""The admin's policy on the real control plane (issue 42, item 1): the operator, running with the policy
the tests allow (policykit), refuses a run that asks for more, and a pod that asks for no GPU sees none."""

from __future__ import annotations

import pytest
from clusterkit import example_run, wait_for

from rlscale.operator import constants as C

pytestmark = pytest.mark.cluster


def _failed(kube, name, ns):
    r = kube.get("rlrun", name, ns) or {}
    return next((c for c in (r.get("status") or {}).get("conditions", []) if c["type"] == C.COND_FAILED), {})


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
