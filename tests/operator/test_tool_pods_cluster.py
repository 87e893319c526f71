"""Tool pods on the real control plane (kwok nodes): the operator, running under the admin policy the tests allow
(policykit: RuntimeClass gvisor), renders a run's tool-worker pods under the RuntimeClass its
spec.task.toolSandbox names, and refuses a run naming one the admin did not allow, creating nothing for it.
gVisor itself never runs here: kwok's nodes only pretend to run pods."""

from __future__ import annotations

import pytest
from clusterkit import example_run, wait_for

from rlscale.operator import constants as C
from rlscale.spec.tools import TOOL_SERVER_ENV

pytestmark = pytest.mark.cluster

TOOLS = [{"name": "calculator", "builtin": "calculator"}]


def _tool_run(name: str, runtime_class: str) -> dict:
    return example_run(name, task={"tools": TOOLS, "toolSandbox": {"isolation": "pod", "replicas": 2,
                                                                  "runtimeClassName": runtime_class}})


@pytest.fixture
def gvisor(kube):
    """The RuntimeClass a cluster with gVisor installed has (its pods are refused without one)."""
    kube.apply({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "gvisor"},
                "handler": "runsc"})
    yield "gvisor"
    kube.run("delete", "runtimeclass", "gvisor", "--wait=false", check=False)


def test_the_operator_runs_the_tool_pods_under_the_allowed_runtime_class(kube, operator, ns, gvisor):
    kube.apply(_tool_run("sandboxed", gvisor), ns)
    dep = wait_for("the tool Deployment", lambda: kube.get("deployment", "sandboxed-tools", ns))
    assert dep["spec"]["template"]["spec"]["runtimeClassName"] == "gvisor"
    assert dep["spec"]["template"]["spec"]["containers"][0]["command"][:2] == ["rlscale", "tool-server"]
    np = kube.get("networkpolicy", "sandboxed-tools", ns)
    assert np["spec"]["policyTypes"] == ["Ingress", "Egress"] and not np["spec"].get("egress")
    assert kube.get("service", "sandboxed-tools", ns)["spec"]["ports"][0]["name"] == "tools"
    sts = wait_for("the learner StatefulSet", lambda: kube.get("statefulset", "sandboxed-learner", ns))
    env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[TOOL_SERVER_ENV] == f"http://sandboxed-tools.{ns}.svc:8700"
    # The API server took the pods (its RuntimeClass admission and the namespace's Pod Security included).
    pods = wait_for("2 tool pods", lambda: (lambda p: p if len(p) >= 2 else None)(kube.get(
        "pods", ns=ns, selector=f"{C.LABEL_RUN}=sandboxed,{C.LABEL_ROLE}={C.ROLE_TOOLS}")["items"]))
    assert {p["spec"]["runtimeClassName"] for p in pods} == {"gvisor"}


def test_a_runtime_class_the_admin_did_not_allow_gets_nothing(kube, operator, ns):
    kube.apply(_tool_run("kata-run", "kata"), ns)

    def failed():
        r = kube.get("rlrun", "kata-run", ns) or {}
        c = next((c for c in (r.get("status") or {}).get("conditions", []) if c["type"] == C.COND_FAILED), {})
        return c if c.get("reason") == "NotAllowed" else None
    c = wait_for("NotAllowed", failed)
    assert "spec.task.toolSandbox.runtimeClassName is 'kata'" in c["message"], c
    assert "policy.runtimeClassNames" in c["message"] and "'gvisor'" in c["message"]
    assert not kube.get("deployment", ns=ns, selector=f"{C.LABEL_RUN}=kata-run")["items"]
    assert not kube.get("statefulset", ns=ns, selector=f"{C.LABEL_RUN}=kata-run")["items"]
