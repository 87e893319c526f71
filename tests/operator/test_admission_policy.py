"""The chart's ValidatingAdmissionPolicies on the real API server (issue 42, item 7): the operator's account,
which RBAC lets patch any pod and create any ConfigMap, changes only the deletion-cost annotation of a run's
pods and only objects it manages; a run's runner account, which RBAC lets patch its RLRun, changes only the
progress annotation. The session's operator runs under them (conftest.py installs them with its RBAC)."""

from __future__ import annotations

import json

import pytest
from clusterkit import OPERATOR_NS, OPERATOR_SA, example_run, wait_for

from rlscale.operator import builders as B
from rlscale.operator import constants as C

pytestmark = pytest.mark.cluster

OPERATOR = f"system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}"
COST = "controller.kubernetes.io/pod-deletion-cost"


def _as(kube, user, *args):
    return kube.run(f"--as={user}", *args, check=False)


def test_the_operator_and_runner_accounts_change_only_what_they_manage(kube, operator, ns):
    kube.apply(example_run("scoped"), ns)
    pod = wait_for("a rollout pod", lambda: next(iter(kube.get(
        "pods", ns=ns, selector=f"{C.LABEL_RUN}=scoped,{C.LABEL_ROLE}={C.ROLE_ROLLOUT}")["items"]), None))
    name = pod["metadata"]["name"]
    # The operator's account: a run's pod's deletion cost, yes; its labels, no.
    ok = _as(kube, OPERATOR, "patch", "pod", name, "-n", ns, "--type=merge",
             "-p", json.dumps({"metadata": {"annotations": {COST: "-5"}}}))
    assert ok.returncode == 0, ok.stderr
    out = _as(kube, OPERATOR, "patch", "pod", name, "-n", ns, "--type=merge",
              "-p", json.dumps({"metadata": {"labels": {C.LABEL_ROLE: "learner"}}}))
    assert out.returncode != 0 and f"may change only the {COST} annotation" in out.stderr, out.stderr
    # An object it does not manage: RBAC allows the create, the policy does not.
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "not-a-child", "namespace": ns}}
    out = kube.run(f"--as={OPERATOR}", "create", "-f", "-", input=json.dumps(cm), check=False)
    assert out.returncode != 0 and "only objects labelled app.kubernetes.io/managed-by" in out.stderr, out.stderr
    # The runner account: the progress annotation of its RLRun, yes; its spec or finalizers, no.
    runner = f"system:serviceaccount:{ns}:{B.names('scoped')[C.ROLE_RUNNER]}"
    ok = _as(kube, runner, "patch", "rlrun", "scoped", "-n", ns, "--type=merge",
             "-p", json.dumps({"metadata": {"annotations": {C.ANNOTATION_PROGRESS: json.dumps({"step": 1})}}}))
    assert ok.returncode == 0, ok.stderr
    for patch in ({"spec": {"budget": {"gpus": 64}}}, {"metadata": {"finalizers": ["x.example/hold"]}},
                  {"metadata": {"annotations": {"example.com/other": "x"}}}):
        out = _as(kube, runner, "patch", "rlrun", "scoped", "-n", ns, "--type=merge", "-p", json.dumps(patch))
        assert out.returncode != 0 and "may change only the rlscale.dev/progress annotation" in out.stderr, \
            (patch, out.stderr)
    assert kube.get("rlrun", "scoped", ns)["spec"]["budget"]["gpus"] != 64
