"""The local cluster's real node runs containers: pods complete and have logs, cluster DNS
resolves Service and StatefulSet pod names, kube-proxy routes ClusterIPs, and pods reach
the API server through the `kubernetes` Service with their service account token."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hack import cluster as cp
from tests.conftest import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import Node  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

NODE_NET = ipaddress.ip_network(cp.NODE_CIDR)


def test_real_node_is_ready_with_the_machines_capacity(node):
    n = node.get("node", cp.NODE_NAME)
    assert n["metadata"]["labels"][cp.REAL_NODE_LABEL] == "real"
    assert not n["spec"].get("taints")
    cap = n["status"]["capacity"]
    assert int(cap["cpu"]) == os.cpu_count()
    mem_kib = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                       if line.startswith("MemTotal:")))
    assert cap["memory"] == f"{mem_kib}Ki"
    addrs = {a["type"]: a["address"] for a in n["status"]["addresses"]}
    assert addrs["InternalIP"] == cp.NODE_IP
    assert n["status"]["nodeInfo"]["kubeletVersion"] == cp.versions()["K8S_VERSION"]
    assert n["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    # The kwok fake node runs alongside, Ready too.
    fake = node.get("node", "gpu-node-0")
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in fake["status"]["conditions"])


def test_pod_runs_to_completion_with_logs(node):
    ns = node.namespace("node-pod")
    pod, log = node.run_pod(ns, "hello", ["/bin/sh", "-c", "echo hello from $(hostname); cat /etc/resolv.conf"])
    assert pod["status"]["phase"] == "Succeeded", json.dumps(pod["status"], indent=1)
    assert pod["spec"]["nodeName"] == cp.NODE_NAME
    assert ipaddress.ip_address(pod["status"]["podIP"]) in NODE_NET
    assert "hello from hello" in log
    assert f"nameserver {cp.DNS_SERVICE_IP}" in log
    assert f"search {ns}.svc.{cp.CLUSTER_DOMAIN}" in log


@pytest.fixture(scope="module")
def web(node):
    """A StatefulSet `web` (1 replica) behind a headless Service `web`, and a ClusterIP
    Service `echo` on port 80 in front of the same pods; returns (namespace, ClusterIP)."""
    ns = node.namespace("node-net")
    labels = {"app": "web"}
    node.apply([
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": ns},
         "spec": {"clusterIP": "None", "selector": labels, "ports": [{"name": "http", "port": 8080}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo", "namespace": ns},
         "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "web", "namespace": ns},
         "spec": {"serviceName": "web", "replicas": 1, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels},
                               "spec": node.pod_spec(["/bin/probe", "serve", "8080", "hello"],
                                                     restart="Always")}}},
    ])

    def ready():
        p = node.get("pod", "web-0", ns)
        conds = (p or {}).get("status", {}).get("conditions", [])
        return p if any(c["type"] == "Ready" and c["status"] == "True" for c in conds) else None
    pod = wait_for("web-0 Ready", ready, 90, 0.5)
    ip = node.get("service", "echo", ns)["spec"]["clusterIP"]
    return ns, ip, pod["status"]["podIP"]


def test_cluster_dns_resolves_services_and_statefulset_pods(node, web):
    ns, cluster_ip, pod_ip = web
    pod, log = node.run_pod(ns, "resolve", ["/bin/probe", "resolve", f"echo.{ns}.svc",
                                            f"echo.{ns}.svc.{cp.CLUSTER_DOMAIN}", "echo",
                                            f"web-0.web.{ns}.svc", "kubernetes.default.svc"])
    assert pod["status"]["phase"] == "Succeeded", log
    got = dict(line.split() for line in log.splitlines())
    assert got[f"echo.{ns}.svc"] == cluster_ip
    assert got[f"echo.{ns}.svc.{cp.CLUSTER_DOMAIN}"] == cluster_ip
    assert got["echo"] == cluster_ip  # the pod's search list
    assert got[f"web-0.web.{ns}.svc"] == pod_ip
    assert got["kubernetes.default.svc"] == cp.API_SERVICE_IP


def test_cluster_ip_reaches_the_pod_through_kube_proxy(node, web):
    ns, cluster_ip, _ = web
    pod, log = node.run_pod(ns, "fetch", ["/bin/sh", "-c",
                                          f"/bin/probe get http://{cluster_ip}/ && /bin/probe get http://echo/"])
    assert pod["status"]["phase"] == "Succeeded", log
    assert log.count("200 hello from web-0") == 2, log
    # kubectl exec goes apiserver -> kubelet (node IP, its CA-signed serving cert) -> containerd.
    out = node.run("exec", "-n", ns, "web-0", "--", "/bin/probe", "get", "http://127.0.0.1:8080/")
    assert "200 hello from web-0" in out.stdout


def test_pod_reaches_the_api_server_through_the_kubernetes_service(node, web):
    ns, _, _ = web
    pod, log = node.run_pod(ns, "api", ["/bin/probe", "apiserver"])
    assert pod["status"]["phase"] == "Succeeded", log
    version = cp.versions()["K8S_VERSION"]
    lines = log.splitlines()
    assert lines[0].startswith(f"GET https://{cp.API_SERVICE_IP}:443/version 200 "), log
    assert f'"gitVersion":"{version}"' in lines[0]
    assert lines[1].startswith("GET https://kubernetes.default.svc/version 200 "), log
    assert lines[2].startswith("POST selfsubjectreviews 201 "), log
    assert f'"username":"system:serviceaccount:{ns}:default"' in lines[2]



def _procs_with_argv(argv: list[bytes]) -> list[int]:
    want = b"\0".join(argv) + b"\0"
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if (p / "cmdline").read_bytes() == want:
                    out.append(int(p.name))
            except OSError:
                pass
    return out


@pytest.mark.kills_real_node
def test_up_after_a_hard_kill_then_down_leaves_nothing(node_cluster, node, tmp_path):
    """Runs last (conftest): SIGKILLs the session's cluster with a pod running, starts a new one (which
    must clean up after the dead one and find the imported image again), then stops it."""
    ns = node.namespace("node-kill")
    argv = ["/bin/sleep", "3617"]
    node.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper", "namespace": ns},
                "spec": node.pod_spec(argv)})
    wait_for("sleeper running", lambda: _procs_with_argv([a.encode() for a in argv]), 60, 0.5)
    for pid in node_cluster.pids.values():
        os.kill(pid, signal.SIGKILL)
    again = tmp_path / "again"
    c2 = cp.up(again, nodes=0, install_crd=False, reuse=False, real_node=True)
    try:
        assert not _procs_with_argv([a.encode() for a in argv]), "the dead cluster's pod survived"
        n2 = Node(c2)
        pod, log = n2.run_pod(n2.namespace("again"), "again", ["/bin/echo", "again"])
        assert pod["status"]["phase"] == "Succeeded" and log.strip() == "again"
    finally:
        cp.down(again)
    assert cp.NODE_BRIDGE not in Path("/proc/net/dev").read_text()
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert "kube-proxy" not in tables
    run = str(cp.node_root() / "run")
    assert not [m for m in Path("/proc/self/mountinfo").read_text().splitlines() if run in m]
    assert not list(Path("/sys/fs/cgroup").glob("*/kubepods"))
    sock = str(cp.containerd_socket()).encode()
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _has(p, sock)]


def _has(p: Path, needle: bytes) -> bool:
    try:
        return needle in (p / "cmdline").read_bytes()
    except OSError:
        return False
