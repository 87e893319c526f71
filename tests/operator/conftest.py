"""Fixtures for the operator tests: the real loopback control plane (session), the operator
running as the service account the chart ships, and a fresh namespace per test."""

from __future__ import annotations

import itertools
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

# The test modules import clusterkit by name (importlib mode gives them no package).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from clusterkit import OPERATOR_NS, OPERATOR_SA, Kube, Operator, chart_objects, cp  # noqa: E402


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """A fresh control plane for this session (about 20 s warm); stopped at the end."""
    missing = [b for b in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                           "kubectl", "kwok", "helm") if not (cp.bin_dir() / b).exists()]
    if missing:
        pytest.fail(f"control plane binaries missing in {cp.bin_dir()}: {', '.join(missing)}; "
                    "run `make k8s` (bash hack/cluster/build.sh) first", pytrace=False)
    state = Path(os.environ.get("RLSCALE_TEST_CLUSTER_DIR") or tmp_path_factory.mktemp("cluster"))
    t0 = time.monotonic()
    c = cp.up(state, nodes=4, gpus_per_node=8, reuse=False)
    print(f"\ncontrol plane up in {time.monotonic() - t0:.1f}s at {c.server}", file=sys.stderr)
    yield c
    cp.down(state)


@pytest.fixture(scope="session")
def kube(cluster) -> Kube:
    return Kube(cluster)


@pytest.fixture(scope="session")
def operator_kubeconfig(cluster, kube, tmp_path_factory) -> Path:
    """Install the chart's ServiceAccount, RBAC and admission policies as rendered, and return a kubeconfig
    that authenticates as that account: the operator gets exactly the rights it ships with."""
    helm = cp.bin_dir() / "helm"
    assert helm.exists(), f"{helm} missing: run `make k8s`"
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NS}})
    rbac = [o for o in chart_objects(helm) if o["kind"] in
            ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
             "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")]
    assert {o["kind"] for o in rbac} >= {"ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                         "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    kube.apply({"apiVersion": "v1", "kind": "List", "items": rbac})
    token = kube.run("create", "token", OPERATOR_SA, "-n", OPERATOR_NS, "--duration=6h").stdout.strip()
    path = tmp_path_factory.mktemp("operator") / "operator.kubeconfig"
    return cp.write_kubeconfig(path, cluster.server, cluster.dir / "pki" / "ca.crt", token=token)


@pytest.fixture(scope="session")
def operator(operator_kubeconfig, tmp_path_factory):
    """One operator for the session; tests that restart it leave it running again."""
    op = Operator(operator_kubeconfig, tmp_path_factory.mktemp("operator-logs")).start()
    yield op
    op.kill(signal.SIGTERM)


_ns_counter = itertools.count()


@pytest.fixture
def ns(kube, request):
    """A fresh namespace per test (Pod Security enforced at baseline), deleted afterwards (without waiting)."""
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower().removeprefix("test_"))[:40].strip("-")
    name = f"t-{base}-{next(_ns_counter)}"
    # The operator runs nothing in a namespace without a Pod Security enforce label (the chart's
    # policy.requirePodSecurity); the API server then checks every pod of the runs at baseline.
    kube.apply({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": "baseline"}}})
    # The GPU examples mount the claim `models` (the model's Hugging Face cache and the
    # dataset): a PersistentVolume bound to it, so their pods schedule on the kwok nodes.
    pv = f"{name}-models"
    kube.apply({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
         "spec": {"capacity": {"storage": "1Ti"}, "accessModes": ["ReadOnlyMany", "ReadWriteMany"],
                  "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "",
                  "hostPath": {"path": "/models"}, "claimRef": {"namespace": name, "name": "models"}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "models", "namespace": name},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
                  "resources": {"requests": {"storage": "1Ti"}}}}]})
    yield name
    kube.run("delete", "namespace", name, "--wait=false", check=False)
    kube.run("delete", "persistentvolume", pv, "--wait=false", check=False)



