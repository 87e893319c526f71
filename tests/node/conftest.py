"""Fixtures for the real-node tests: the control plane with a real node (containerd,
kubelet, kube-proxy, CoreDNS) next to one kwok fake node, and a test image (busybox plus
the probe client) imported into the node's containerd."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hack import cluster as cp
from hack.cluster import Kube
from hack.cluster import nodeimages as ni
from hack.cluster import quickstart as qs  # the README's Kubernetes path (images, chart, claims)
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[2]
IMAGE = "rlscale.local/nodetest:1"


def pytest_configure(config):
    config.addinivalue_line("markers", "kills_real_node: SIGKILLs the session's real-node cluster; runs last")


def pytest_collection_modifyitems(session, config, items):
    """Tests that kill the session's real node run after every other test of the session."""
    last = [i for i in items if i.get_closest_marker("kills_real_node")]
    if last:
        items[:] = [i for i in items if i not in last] + last


class Node(Kube):
    """The kubectl helper, plus namespaces and pods on the real node from the test image."""

    def namespace(self, name: str) -> str:
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        # Pods are refused until the controller-manager made the namespace's default SA.
        wait_for(f"serviceaccount default in {name}", lambda: self.get("serviceaccount", "default", name),
                 60, 0.5)
        return name

    @staticmethod
    def pod_spec(command: list[str], restart: str = "Never") -> dict:
        return {"restartPolicy": restart, "terminationGracePeriodSeconds": 1,
                "nodeSelector": {cp.REAL_NODE_LABEL: "real"},
                "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                                "command": command}]}

    def run_pod(self, ns: str, name: str, command: list[str], timeout: float = 60) -> tuple[dict, str]:
        """Run a pod to completion on the real node; return it and its log."""
        self.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
                    "spec": self.pod_spec(command)})

        def done():
            p = self.get("pod", name, ns)
            return p if p and p["status"].get("phase") in ("Succeeded", "Failed") else None
        pod = wait_for(f"pod {ns}/{name} to finish", done, timeout, 0.5)
        log = self.run("logs", "-n", ns, name).stdout
        return pod, log


def _build_probe(out: Path) -> bytes:
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-buildvcs=false"}
    r = subprocess.run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(out), "."],
                       cwd=Path(__file__).parent / "probe", env=env, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"building tests/node/probe failed: {r.stderr}", pytrace=False)
    return out.read_bytes()


@pytest.fixture(scope="session")
def node_cluster(tmp_path_factory):
    """The control plane with the real node, one fake node and the CRD; stopped at the end."""
    missing = [b for b in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                           "kubectl", "kwok", "kubelet", "kube-proxy", "coredns")
               if not (cp.bin_dir() / b).exists()]
    if missing:
        pytest.fail(f"binaries missing in {cp.bin_dir()}: {', '.join(missing)}; run `make k8s`",
                    pytrace=False)
    state = Path(os.environ.get("RLSCALE_TEST_NODE_CLUSTER_DIR") or tmp_path_factory.mktemp("node-cluster"))
    t0 = time.monotonic()
    try:
        c = cp.up(state, nodes=1, gpus_per_node=8, reuse=False, real_node=True)
    except cp.ClusterError as e:
        pytest.fail(f"cluster with a real node did not start: {e}", pytrace=False)
    print(f"\ncontrol plane + real node Ready in {time.monotonic() - t0:.1f}s at {c.server}", file=sys.stderr)
    yield c
    cp.down(state)


@pytest.fixture(scope="session")
def node(node_cluster, tmp_path_factory) -> Node:
    """The cluster, with the test image (busybox + probe) in the node's containerd."""
    d = tmp_path_factory.mktemp("nodetest-image")
    probe = _build_probe(d / "probe")
    archive = d / "nodetest.tar"
    digest = ni.build_busybox(archive, ref=IMAGE, extra={"bin/probe": (probe, 0o755)})
    ni.import_archive(Path(node_cluster.containerd_socket), archive, IMAGE, digest)
    return Node(node_cluster)


@pytest.fixture(scope="session")
def images(node_cluster) -> dict[str, str]:
    """The operator, trainer and rollout images built here and in the node's runtime."""
    return qs.build_and_load_images(node_cluster.containerd_socket)
