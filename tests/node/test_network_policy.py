"""The real node enforces NetworkPolicies (kube-router's network policy controller, started by
hack/cluster/realnode.py; the bridge CNI itself enforces none). The policy is the one the
operator gives each run (builders.build_network_policy): the run's pods admit connections
from pods with the run's label in their own namespace on every port, and from pods of the
listed metrics namespaces on the metrics port only. Connections go to the server pod's IP,
from pods on the same bridge and from this machine (as the kubelet's probes and the tests'
Prometheus connect). With restricted egress (networkPolicy.egress, operator/egress.py) the
run's pods reach DNS, the API server (at the endpoints its EndpointSlice names, as the
operator reads them) and each other, and nothing else: a pod of another namespace is dropped."""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack import cluster as cp
from rlscale.operator import builders as B
from rlscale.operator import constants as C
from rlscale.operator import egress as E
from tests.conftest import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import Node  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

RUN = "np"
NS_A, NS_B = "netpol-run", "netpol-monitoring"  # the run's namespace; a metrics namespace
MAIN, METRICS = 8080, C.METRICS_PORT  # any port of a run pod (Ray's, say); the metrics port
MEMBER = {C.LABEL_RUN: RUN}
# Without the owner reference (no RLRun owns it here; the garbage collector would delete it).
POLICY = B.build_network_policy(B.RunRef(name=RUN, namespace=NS_A, uid="0"), (NS_B,))
POLICY["metadata"] = {"name": POLICY["metadata"]["name"], "namespace": NS_A}
# (namespace, pod, labels): a pod of the run, a pod in the run's namespace without its label,
# and a pod of the metrics namespace with the run's label (the policy's podSelector names
# pods of its own namespace only).
CLIENTS = [(NS_A, "member", MEMBER), (NS_A, "outsider", {}), (NS_B, "stranger", MEMBER)]
# A server the run does not need: a pod of another namespace that no policy selects.
ELSEWHERE = (NS_B, "elsewhere")


def _pod(node: Node, ns: str, name: str, labels: dict, command: list[str]) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": node.pod_spec(command)}


@pytest.fixture(scope="module")
def server_ip(node) -> Iterator[str]:
    """The server pod (HTTP on MAIN and METRICS) and the client pods, Running; the server's IP."""
    node.namespace(NS_A)
    node.namespace(NS_B)
    serve = f"/bin/probe serve {METRICS} metrics & exec /bin/probe serve {MAIN} main"
    node.apply([_pod(node, NS_A, "server", MEMBER, ["/bin/sh", "-c", serve]),
                _pod(node, *ELSEWHERE, {}, ["/bin/probe", "serve", str(MAIN), "elsewhere"]),
                *[_pod(node, ns, name, labels, ["/bin/sleep", "3600"]) for ns, name, labels in CLIENTS]])

    def running(ns: str, name: str):
        p = node.get("pod", name, ns)
        return p if p and p["status"].get("phase") == "Running" and p["status"].get("podIP") else None
    for ns, name, _ in [(NS_A, "server", {}), (*ELSEWHERE, {}), *CLIENTS]:
        wait_for(f"pod {ns}/{name} Running", lambda ns=ns, name=name: running(ns, name), 90, 0.5)
    yield node.get("pod", "server", NS_A)["status"]["podIP"]
    node.run("delete", "namespace", NS_A, NS_B, "--wait=false", check=False)


def connect(node: Node, ns: str, pod: str, ip: str, port: int) -> str:
    """An HTTP GET from the client pod to ip:port: "200 ..." when it connected, else the error
    (a refused connection: kube-router REJECTs, so a blocked attempt fails at once)."""
    out = node.run("exec", "-n", ns, pod, "--", "/bin/probe", "get", f"http://{ip}:{port}/",
                   check=False, timeout=30)
    return (out.stdout + out.stderr).strip()


def reach(node: Node, ip: str) -> dict[tuple[str, int], bool]:
    """Which client connects to which of the server's ports."""
    return {(pod, port): connect(node, ns, pod, ip, port).startswith("200 ")
            for ns, pod, _ in CLIENTS for port in (MAIN, METRICS)}


EVERYONE = {(pod, port): True for _, pod, _ in CLIENTS for port in (MAIN, METRICS)}


def from_this_machine(ip: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{ip}:{port}/", timeout=10) as r:
        return f"{r.status} {r.read().decode().strip()}"


def test_without_a_policy_every_pod_connects(node, server_ip):
    node.run("delete", "networkpolicy", POLICY["metadata"]["name"], "-n", NS_A, "--ignore-not-found")
    # The server's first answer (its listener may come up a moment after Running).
    wait_for("the member to reach the server", lambda: connect(node, NS_A, "member", server_ip, MAIN)
             .startswith("200 main from server"), 30, 0.5)
    assert reach(node, server_ip) == EVERYONE


def test_the_runs_policy_admits_its_pods_and_the_metrics_namespace_on_the_metrics_port(node, server_ip):
    node.apply(POLICY)
    try:
        # kube-router applies a policy change in a full sync that follows the event.
        seen: list[str] = []

        def refused() -> bool:
            seen.append(connect(node, NS_B, "stranger", server_ip, MAIN))
            return not seen[-1].startswith("200 ")
        try:
            wait_for("the policy to refuse the stranger on the main port", refused, 30, 0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}; the stranger's last attempt: {seen[-1]!r}") from None
        assert "connection refused" in seen[-1], seen[-1]
        assert reach(node, server_ip) == {
            ("member", MAIN): True, ("member", METRICS): True,  # the podSelector rule: every port
            ("outsider", MAIN): False, ("outsider", METRICS): False,  # no label, not the listed namespace
            ("stranger", MAIN): False, ("stranger", METRICS): True,  # the namespaceSelector rule: its port
        }
        # The node itself is let through (kube-router's rule for traffic from a local address).
        assert from_this_machine(server_ip, MAIN) == "200 main from server"
        assert from_this_machine(server_ip, METRICS) == "200 metrics from server"
    finally:
        node.run("delete", "networkpolicy", POLICY["metadata"]["name"], "-n", NS_A, "--ignore-not-found")
    # Deleting the policy lifts it.
    wait_for("the stranger to reach the main port again", lambda: connect(node, NS_B, "stranger", server_ip, MAIN)
             .startswith("200 "), 30, 0.5)
    assert reach(node, server_ip) == EVERYONE


def test_restricted_egress_reaches_dns_the_api_server_and_the_run_and_drops_the_rest(node, server_ip):
    elsewhere = node.get("pod", ELSEWHERE[1], ELSEWHERE[0])["status"]["podIP"]
    wait_for("the member to reach a pod elsewhere with no policy", lambda: connect(
        node, NS_A, "member", elsewhere, MAIN).startswith("200 elsewhere"), 30, 0.5)
    # The API server's endpoints as the operator reads them (its controller's ApiServerEndpoints).
    api = E.endpoints(node.get("endpointslice", "kubernetes", "default"))
    assert api, "the EndpointSlice default/kubernetes names no endpoint"
    policy = B.build_network_policy(B.RunRef(name=RUN, namespace=NS_A, uid="0"), (NS_B,),
                                    images=B.Images(egress="restricted", api_server=api))
    policy["metadata"] = {"name": policy["metadata"]["name"], "namespace": NS_A}
    assert "Egress" in policy["spec"]["policyTypes"]
    node.apply(policy)
    try:
        seen: list[str] = []

        def dropped() -> bool:
            seen.append(connect(node, NS_A, "member", elsewhere, MAIN))
            return not seen[-1].startswith("200 ")
        try:
            wait_for("the policy to drop the member's connection elsewhere", dropped, 30, 0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}; the member's last attempt: {seen[-1]!r}") from None
        # Only the run's pods are held: a pod of the run's namespace without its label still connects.
        assert connect(node, NS_A, "outsider", elsewhere, MAIN).startswith("200 elsewhere")
        # Nor does the run reach the node beyond DNS and the API server: its kubelet (HTTPS, so a plain GET
        # that connects is answered 400) is dropped too, while the outsider connects.
        node_ip, kubelet_port = _kubelet(node)
        assert connect(node, NS_A, "outsider", node_ip, kubelet_port).startswith("400 "), (node_ip, kubelet_port)
        assert not connect(node, NS_A, "member", node_ip, kubelet_port).startswith(("200 ", "400 "))
        # The run's own pods, its DNS and its API server (by the Service's address and by name).
        assert connect(node, NS_A, "member", server_ip, MAIN).startswith("200 main from server")
        dns = node.run("exec", "-n", NS_A, "member", "--", "/bin/probe", "resolve", "kubernetes.default.svc",
                       check=False, timeout=30)
        assert dns.returncode == 0, dns.stdout + dns.stderr
        out = node.run("exec", "-n", NS_A, "member", "--", "/bin/probe", "apiserver", check=False, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.count("/version 200 ") == 2 and "POST selfsubjectreviews 201" in out.stdout, out.stdout
    finally:
        node.run("delete", "networkpolicy", policy["metadata"]["name"], "-n", NS_A, "--ignore-not-found")


def _kubelet(node: Node) -> tuple[str, int]:
    """The real node's address and its kubelet's port, as its Node object says."""
    (n,) = [n for n in node.get("node")["items"] if n["metadata"]["labels"].get(cp.REAL_NODE_LABEL) == "real"]
    ip = next(a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP")
    return ip, int(n["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"])
