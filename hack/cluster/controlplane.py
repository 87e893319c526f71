"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, controller-manager,
scheduler and kwok fake GPU nodes; optionally (real_node=True) a real node next to it
(realnode.py). up() and down() are what `python -m hack.cluster up|down` and the pytest
fixtures call. Stdlib only."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .config import (
    COMPONENTS,
    CRD_DIR,
    FAKE_NODE_ANNOTATION,
    GPU_RESOURCE,
    HERE,
    LOOPBACK,
    NODE_COMPONENTS,
    NODE_IP,
    NODE_NAME,
    POD_CIDR,
    SERVICE_CIDR,
    ClusterError,
    bin_dir,
    containerd_socket,
    default_state_dir,
    free_port,
)
from .pki import make_pki, write_kubeconfig
from .procs import pid_alive, port_open, spawn, stop, tail, wait_until
from .realnode import (
    check_node_prerequisites,
    claim_node,
    node_holder,
    node_network_up,
    release_node,
    start_containerd,
    start_real_node,
    stop_node_components,
)


@dataclass
class Cluster:
    """A running control plane: its folder, ports and process ids."""

    dir: Path
    etcd_port: int = 0
    etcd_peer_port: int = 0
    api_port: int = 0
    kwok_port: int = 0
    nodes: int = 0
    gpus_per_node: int = 0
    pids: dict[str, int] = field(default_factory=dict)
    # The address the API server binds and the kubeconfigs use: loopback, or the real
    # node's IP (a local address too: that traffic never leaves the machine).
    host: str = LOOPBACK
    real_node: bool = False
    node_name: str = ""
    node_ip: str = ""
    containerd_socket: str = ""
    kubelet_port: int = 0
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://{self.host}:{self.api_port}"

    def save(self) -> None:
        d = asdict(self)
        d["dir"] = str(self.dir)
        (self.dir / "state.json").write_text(json.dumps(d, indent=2))

    @classmethod
    def load(cls, state_dir: Path) -> Cluster | None:
        p = Path(state_dir) / "state.json"
        if not p.exists():
            return None
        d = json.loads(p.read_text())
        d["dir"] = Path(d["dir"])
        return cls(**d)

    def alive(self) -> bool:
        comps = COMPONENTS + (NODE_COMPONENTS if self.real_node else [])
        return all(pid_alive(self.pids.get(c, 0)) for c in comps) and self.healthy()

    def healthy(self) -> bool:
        try:
            out = self.kubectl("get", "--raw", "/readyz", timeout=10, check=False)
        except subprocess.TimeoutExpired:
            return False
        return out.returncode == 0 and out.stdout.strip() == "ok"

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 60,
                check: bool = True, kubeconfig: Path | None = None) -> subprocess.CompletedProcess:
        """Run the built kubectl against this cluster (admin unless kubeconfig is given)."""
        cmd = [str(bin_dir() / "kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        out = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
        return out

    def log(self, component: str) -> Path:
        return self.dir / "logs" / f"{component}.log"


# Next to a real node, fake nodes are tainted PreferNoSchedule: pods that fit the real node
# (a CPU run's) go there rather than to a node where nothing runs, while GPU pods, which only
# fake nodes can hold, still schedule on them.
FAKE_NODE_TAINT = {"key": "rlscale.dev/fake-node", "value": "true", "effect": "PreferNoSchedule"}


def node_manifest(name: str, gpus: int, beside_real_node: bool = False) -> dict:
    """A fake node kwok keeps Ready, with GPU capacity for the scheduler to count."""
    cap = {"cpu": "96", "memory": "1024Gi", "pods": "110", GPU_RESOURCE: str(gpus)}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "type": "kwok",
                       "nvidia.com/gpu.present": "true"},
        },
        "spec": {"taints": [FAKE_NODE_TAINT]} if beside_real_node else {},
        "status": {"capacity": cap, "allocatable": cap},
    }


def up(state_dir: Path | None = None, nodes: int = 4, gpus_per_node: int = 8,
       install_crd: bool = True, reuse: bool = True, real_node: bool = False) -> Cluster:
    """Start (or reuse a healthy) control plane in state_dir and return it; with real_node
    also a node that runs containers (see start_real_node)."""
    state_dir = Path(state_dir or default_state_dir()).resolve()
    old = Cluster.load(state_dir)
    if reuse and old and old.real_node == real_node and old.alive():
        if install_crd:
            apply_crds(old)
        return old
    if old:
        down(state_dir)
    if real_node:
        _claim_node(state_dir)
    if state_dir.exists():
        shutil.rmtree(state_dir)
    (state_dir / "logs").mkdir(parents=True)
    c = Cluster(dir=state_dir, etcd_port=free_port(), etcd_peer_port=free_port(),
                api_port=free_port(), kwok_port=free_port(), nodes=nodes, gpus_per_node=gpus_per_node)
    if real_node:
        c.real_node, c.host, c.node_name, c.node_ip = True, NODE_IP, NODE_NAME, NODE_IP
        c.containerd_socket = str(containerd_socket())
    c.save()
    try:
        if real_node:
            node_network_up(c)
            start_containerd(c)
        _start(c)
        if real_node:
            start_real_node(c)
        if nodes:
            add_nodes(c, nodes, gpus_per_node)
        if install_crd:
            apply_crds(c)
    except BaseException:
        down(state_dir)
        raise
    return c


def _start(c: Cluster) -> None:
    pki = c.dir / "pki"
    make_pki(pki, real_node=c.real_node)
    write_kubeconfig(c.kubeconfig, c.server, pki / "ca.crt", cert=pki / "admin.crt", key=pki / "admin.key")
    etcd_url = f"http://{LOOPBACK}:{c.etcd_port}"
    peer_url = f"http://{LOOPBACK}:{c.etcd_peer_port}"
    spawn(c, "etcd", [
        "--name=rlscale", f"--data-dir={c.dir / 'etcd'}",
        f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=rlscale={peer_url}",
        # A throwaway test store: durability costs seconds per test on slow disks.
        "--unsafe-no-fsync", "--log-level=warn",
    ])
    wait_until("etcd", lambda: port_open(c.etcd_port), 60, c, "etcd")
    if c.real_node:
        # Pods reach the API server through the `kubernetes` Service, whose endpoint the
        # lease reconciler keeps at the node IP; the apiserver reaches kubelets by InternalIP
        # (the node name resolves nowhere) and checks their serving cert against the CA.
        api_net = ["--endpoint-reconciler-type=lease", "--authorization-mode=Node,RBAC",
                   "--kubelet-preferred-address-types=InternalIP",
                   f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                   f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                   f"--kubelet-certificate-authority={pki / 'ca.crt'}"]
    else:
        # Loopback may not be an Endpoints address, and nothing needs that Service here.
        api_net = ["--endpoint-reconciler-type=none", "--authorization-mode=RBAC"]
    spawn(c, "kube-apiserver", [
        f"--etcd-servers={etcd_url}",
        f"--bind-address={c.host}", f"--advertise-address={c.host}", f"--secure-port={c.api_port}",
        *api_net,
        f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}", f"--cert-dir={c.dir / 'apiserver-certs'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--profiling=false", "--v=0",
    ])
    wait_until("kube-apiserver /readyz", c.healthy, 120, c, "kube-apiserver")
    common = [f"--kubeconfig={c.kubeconfig}", "--leader-elect=false", "--profiling=false",
              f"--bind-address={LOOPBACK}", "--secure-port=0"]
    spawn(c, "kube-controller-manager", [
        *common,
        f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # More workers: the bench applies 100 runs at once.
        "--concurrent-deployment-syncs=10", "--concurrent-replicaset-syncs=10",
        "--concurrent-statefulset-syncs=10", "--concurrent-gc-syncs=40",
        "--kube-api-qps=200", "--kube-api-burst=400",
    ])
    spawn(c, "kube-scheduler", common)
    spawn(c, "kwok", [
        f"--config={HERE / 'kwok-stages.yaml'}", "--node-lease-duration-seconds=40",
        f"--kubeconfig={c.kubeconfig}", "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
        f"--cidr={POD_CIDR}", f"--node-ip={LOOPBACK}", f"--node-port={c.kwok_port}",
        f"--server-address={LOOPBACK}:{c.kwok_port}",
    ])
    time.sleep(0.5)
    for comp in ("kube-controller-manager", "kube-scheduler", "kwok"):
        if not pid_alive(c.pids[comp]):
            raise ClusterError(f"{comp} exited at start; last log lines:\n{tail(c.log(comp))}")


def _claim_node(state_dir: Path) -> None:
    """The real node is one per machine: refuse while another live cluster holds it, tear
    down what a dead one left, then claim it."""
    check_node_prerequisites()
    holder = node_holder()
    if holder and holder != state_dir:
        other = Cluster.load(holder)
        if other and other.real_node and other.alive():
            raise ClusterError(f"the real node is in use by the cluster in {holder}; "
                               f"stop it first (bash hack/cluster/down.sh --dir {holder})")
        if other:
            down(holder)
    claim_node(state_dir)


def add_nodes(c: Cluster, count: int, gpus: int, prefix: str = "gpu-node") -> None:
    """Create fake GPU nodes and wait until kwok reports them Ready."""
    items = [node_manifest(f"{prefix}-{i}", gpus, beside_real_node=c.real_node) for i in range(count)]
    c.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    names = [f"node/{m['metadata']['name']}" for m in items]
    out = c.kubectl("wait", "--for=condition=Ready", "--timeout=90s", *names, check=False, timeout=100)
    if out.returncode != 0:
        raise ClusterError(f"fake nodes not Ready: {out.stderr.strip()}\nkwok log:\n{tail(c.log('kwok'))}")


def apply_crds(c: Cluster) -> None:
    """Install the committed CRDs and wait until they are served."""
    files = sorted(CRD_DIR.glob("*.yaml"))
    if not files:
        print(f"note: no CRD in {CRD_DIR}; run `make crd`", file=sys.stderr)
        return
    for f in files:
        c.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f))
    # A CRD read before the API server's controller first writes its status has no conditions,
    # and `kubectl wait` fails on it at once ("<nil> is of the type <nil>") instead of waiting:
    # seen once on a 2-core machine busy compiling Go. Ask again until the deadline.
    deadline = time.monotonic() + 60
    while True:
        out = c.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all", timeout=70,
                        check=False)
        if out.returncode == 0:
            return
        if time.monotonic() > deadline or "accessor error" not in out.stderr:
            raise ClusterError(f"CRDs not Established: {out.stderr.strip()}")
        time.sleep(0.5)


def down(state_dir: Path | None = None) -> bool:
    """Stop the control plane recorded in state_dir; True when something was running."""
    state_dir = Path(state_dir or default_state_dir())
    c = Cluster.load(state_dir)
    if not c:
        return False
    if c.real_node:
        stop_node_components(c)
    # etcd last and on its own: an apiserver with the lease endpoint reconciler removes
    # its endpoint at shutdown and waits for etcd to answer (15 s when etcd went first).
    stop(c, [n for n in reversed(COMPONENTS) if n != "etcd"])
    stop(c, ["etcd"])
    if c.real_node:
        release_node(Path(c.dir))
    (state_dir / "state.json").unlink(missing_ok=True)
    return True


