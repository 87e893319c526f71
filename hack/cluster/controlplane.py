"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, controller-manager,
scheduler and kwok fake GPU nodes; optionally (real_node=True) a real node next to it:
containerd, kubelet, kube-proxy and CoreDNS on a host bridge. Used by up.sh/down.sh and
the pytest fixtures."""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
# RLSCALE_CRD_DIR: try a CRD other than the committed one (e.g. while changing the spec).
CRD_DIR = Path(os.environ.get("RLSCALE_CRD_DIR") or REPO / "charts" / "rlscale" / "crds")
LOOPBACK = "127.0.0.1"
# Pod IPs kwok hands out are bookkeeping only: nothing here ever connects to them.
POD_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
GPU_RESOURCE = "nvidia.com/gpu"
# Reverse start order: kwok and controllers go before the apiserver, etcd last.
COMPONENTS = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]

# The real node (one per machine: it owns a bridge, nftables tables and ports 53/kubelet).
# NODE_CIDR is a private range used only on this machine; the bridge holds the node IP,
# which is also the pods' gateway, and the API server binds it so pods can reach it.
NODE_NAME = "rlscale-node"
NODE_BRIDGE = "rlscale0"
NODE_CIDR = "10.88.0.0/24"
NODE_IP = "10.88.0.1"
API_SERVICE_IP = "10.96.0.1"  # first address of SERVICE_CIDR: the `kubernetes` Service
DNS_SERVICE_IP = "10.96.0.10"  # kube-system/kube-dns, endpoints: CoreDNS on NODE_IP:53
CLUSTER_DOMAIN = "cluster.local"
REAL_NODE_LABEL = "rlscale.dev/node"  # =real on the real node; kwok nodes have type=kwok
# Stop order is the reverse: kubelet first, containerd after the pods' containers are gone.
NODE_COMPONENTS = ["containerd", "coredns", "kube-proxy", "kubelet"]
CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins


def versions() -> dict[str, str]:
    """The pinned versions from versions.env (KEY=VALUE lines)."""
    out = {}
    for line in (HERE / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def cache_root() -> Path:
    return Path(os.environ.get("RLSCALE_CACHE", Path.home() / ".cache" / "rlscale"))


def bin_dir() -> Path:
    """Where build.sh puts the binaries; RLSCALE_K8S_BIN overrides."""
    env = os.environ.get("RLSCALE_K8S_BIN")
    return Path(env) if env else cache_root() / "k8s" / versions()["K8S_VERSION"]


def default_state_dir() -> Path:
    env = os.environ.get("RLSCALE_CLUSTER_DIR")
    return Path(env) if env else cache_root() / "cluster"


def node_root() -> Path:
    """The real node's persistent folder: containerd's root (images survive a down), the
    containerd socket, and run/ (kubelet root, containerd state) which down() wipes."""
    return cache_root() / "node"


def containerd_socket() -> Path:
    return node_root() / "containerd.sock"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class ClusterError(RuntimeError):
    """A control-plane component failed to build, start or answer."""


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
        return all(_pid_alive(self.pids.get(c, 0)) for c in comps) and self.healthy()

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


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    # A zombie child of this process still answers kill(0); treat it as dead.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _openssl(*args: str, cwd: Path) -> None:
    out = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args[:2])} failed: {out.stderr.strip()}")


def make_pki(pki: Path, real_node: bool = False) -> None:
    """CA, apiserver serving cert (SANs 127.0.0.1, the node IP, the `kubernetes` Service IP
    and names), admin client cert, SA signing keys; with real_node also the kubelet's
    client and serving certs, kube-proxy's client cert and the apiserver's kubelet client."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "3650", "-subj", "/CN=rlscale-local-ca", cwd=pki)
    sans = (f"subjectAltName=IP:127.0.0.1,IP:{NODE_IP},IP:{API_SERVICE_IP},DNS:localhost,"
            "DNS:kubernetes,DNS:kubernetes.default,"
            "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local")
    # system:masters makes the admin cert cluster-admin without any RBAC binding.
    certs = [
        ("apiserver", "/CN=kube-apiserver", sans + "\nextendedKeyUsage=serverAuth"),
        ("admin", "/O=system:masters/CN=rlscale-admin", "extendedKeyUsage=clientAuth"),
    ]
    if real_node:
        certs += [
            # The Node authorizer and NodeRestriction know the kubelet by this name and group.
            ("kubelet", f"/O=system:nodes/CN=system:node:{NODE_NAME}", "extendedKeyUsage=clientAuth"),
            ("kubelet-serving", f"/CN={NODE_NAME}",
             f"subjectAltName=IP:{NODE_IP},DNS:{NODE_NAME}\nextendedKeyUsage=serverAuth"),
            # The default ClusterRoleBinding system:node-proxier names this user.
            ("kube-proxy", "/CN=system:kube-proxy", "extendedKeyUsage=clientAuth"),
            ("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client",
             "extendedKeyUsage=clientAuth"),
        ]
    for name, subj, ext in certs:
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                 f"{name}.csr", "-subj", subj, cwd=pki)
        (pki / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "3650", "-extfile",
                 f"{name}.ext", cwd=pki)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def write_kubeconfig(path: Path, server: str, ca: Path, *, cert: Path | None = None,
                     key: Path | None = None, token: str | None = None, namespace: str = "default") -> Path:
    """A kubeconfig for one user (client cert or bearer token). JSON is valid YAML."""
    user: dict = {"token": token} if token else {"client-certificate": str(cert), "client-key": str(key)}
    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "rlscale",
        "clusters": [{"name": "rlscale", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "rlscale", "user": user}],
        "contexts": [{"name": "rlscale", "context": {"cluster": "rlscale", "user": "rlscale",
                                                     "namespace": namespace}}],
    }
    path.write_text(json.dumps(cfg, indent=2))
    path.chmod(0o600)
    return path


def _spawn(c: Cluster, name: str, args: list[str], exe: Path | None = None) -> int:
    exe = exe or bin_dir() / name
    if not exe.exists():
        raise ClusterError(f"{exe} is missing: run `make k8s` (bash hack/cluster/build.sh) first")
    logf = open(c.log(name), "ab")
    # A new session keeps the daemons alive after up.sh exits and out of its signals.
    p = subprocess.Popen([str(exe), *args], stdout=logf, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True, cwd=c.dir)
    logf.close()
    c.pids[name] = p.pid
    c.save()
    return p.pid


def _wait(what: str, ok, timeout: float, c: Cluster, component: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        if not _pid_alive(c.pids.get(component, 0)):
            raise ClusterError(f"{component} exited while waiting for {what}; "
                               f"last log lines:\n{_tail(c.log(component))}")
        time.sleep(0.2)
    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}; "
                       f"last {component} log lines:\n{_tail(c.log(component))}")


def _tail(p: Path, n: int = 15) -> str:
    try:
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _port_open(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


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
            _node_network_up(c)
            _start_containerd(c)
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
    _spawn(c, "etcd", [
        "--name=rlscale", f"--data-dir={c.dir / 'etcd'}",
        f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=rlscale={peer_url}",
        # A throwaway test store: durability costs seconds per test on slow disks.
        "--unsafe-no-fsync", "--log-level=warn",
    ])
    _wait("etcd", lambda: _port_open(c.etcd_port), 60, c, "etcd")
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
    _spawn(c, "kube-apiserver", [
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
    _wait("kube-apiserver /readyz", c.healthy, 120, c, "kube-apiserver")
    common = [f"--kubeconfig={c.kubeconfig}", "--leader-elect=false", "--profiling=false",
              f"--bind-address={LOOPBACK}", "--secure-port=0"]
    _spawn(c, "kube-controller-manager", [
        *common,
        f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # More workers: the bench applies 100 runs at once.
        "--concurrent-deployment-syncs=10", "--concurrent-replicaset-syncs=10",
        "--concurrent-statefulset-syncs=10", "--concurrent-gc-syncs=40",
        "--kube-api-qps=200", "--kube-api-burst=400",
    ])
    _spawn(c, "kube-scheduler", common)
    _spawn(c, "kwok", [
        f"--config={HERE / 'kwok-stages.yaml'}", "--node-lease-duration-seconds=40",
        f"--kubeconfig={c.kubeconfig}", "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
        f"--cidr={POD_CIDR}", f"--node-ip={LOOPBACK}", f"--node-port={c.kwok_port}",
        f"--server-address={LOOPBACK}:{c.kwok_port}",
    ])
    time.sleep(0.5)
    for comp in ("kube-controller-manager", "kube-scheduler", "kwok"):
        if not _pid_alive(c.pids[comp]):
            raise ClusterError(f"{comp} exited at start; last log lines:\n{_tail(c.log(comp))}")


# ---------------------------------------------------------------------------------------
# The real node: containerd + runc + CNI bridge, kubelet, kube-proxy (nftables), CoreDNS.


def _nodeimages():
    """hack/cluster/nodeimages.py, loaded by path (this file is loaded by path too)."""
    mod = sys.modules.get("rlscale_nodeimages")
    if mod is None:
        spec = importlib.util.spec_from_file_location("rlscale_nodeimages", HERE / "nodeimages.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return mod


def _run(*cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise ClusterError(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    return out


def _owner_file() -> Path:
    return node_root() / "owner"


def _claim_node(state_dir: Path) -> None:
    """The real node is one per machine: refuse while another live cluster holds it, tear
    down what a dead one left (processes, mounts, netns, nft tables, bridge), then claim it."""
    missing = [x for x in ("containerd", "runc", "ctr", "nft", "ip", "gcc")
               if not shutil.which(x)] + [str(p) for p in (CNI_BIN_DIR / "bridge", CNI_BIN_DIR / "host-local")
                                         if not p.exists()]
    if missing:
        raise ClusterError(f"the real node needs {', '.join(missing)}: run `make k8s` "
                           "(it runs hack/cluster/node-deps.sh)")
    bins = [b for b in ("kubelet", "kube-proxy", "coredns") if not (bin_dir() / b).exists()]
    if bins:
        raise ClusterError(f"{', '.join(bins)} missing in {bin_dir()}: run `make k8s`")
    try:
        holder = Path(_owner_file().read_text().strip())
    except OSError:
        holder = None
    if holder and holder != state_dir:
        other = Cluster.load(holder)
        if other and other.real_node and other.alive():
            raise ClusterError(f"the real node is in use by the cluster in {holder}; "
                               f"stop it first (controlplane.py down --dir {holder})")
        if other:
            down(holder)
    node_cleanup()
    node_root().mkdir(parents=True, exist_ok=True)
    _owner_file().write_text(f"{state_dir}\n")


def _node_network_up(c: Cluster) -> None:
    """The bridge with the node IP (the pods' gateway), made before the apiserver binds it."""
    run = node_root() / "run"
    run.mkdir(parents=True, exist_ok=True)
    if _run("ip", "link", "show", NODE_BRIDGE, check=False).returncode != 0:
        _run("ip", "link", "add", NODE_BRIDGE, "type", "bridge")
    prefix = NODE_CIDR.split("/")[1]
    _run("ip", "addr", "replace", f"{NODE_IP}/{prefix}", "dev", NODE_BRIDGE)
    _run("ip", "link", "set", NODE_BRIDGE, "up")
    # Service traffic DNATed to a pod on the same bridge is routed back out of it.
    fwd = Path("/proc/sys/net/ipv4/ip_forward")
    saved = run / "ip_forward.saved"
    if not saved.exists():
        saved.write_text(fwd.read_text())
    fwd.write_text("1\n")


def _containerd_config(c: Cluster) -> Path:
    root, run = node_root(), node_root() / "run"
    cni_dir = run / "cni" / "net.d"
    cni_dir.mkdir(parents=True, exist_ok=True)
    # One bridge, host-local addresses; no ipMasq and no portmap: pods talk only to
    # addresses on this machine, and neither leaves rules behind when a pod is killed.
    conflist = {
        "cniVersion": "0.4.0", "name": "rlscale",
        "plugins": [{
            "type": "bridge", "bridge": NODE_BRIDGE, "isGateway": True, "ipMasq": False,
            "hairpinMode": True,
            "ipam": {"type": "host-local", "dataDir": str(run / "cni" / "ipam"),
                     "ranges": [[{"subnet": NODE_CIDR, "gateway": NODE_IP}]],
                     "routes": [{"dst": "0.0.0.0/0"}]},
        }],
    }
    (cni_dir / "10-rlscale.conflist").write_text(json.dumps(conflist, indent=2))
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    toml = f"""# Written by hack/cluster/controlplane.py for the real node; containerd 1.6 (Debian 12).
version = 2
root = "{root / 'containerd'}"
state = "{run / 'containerd'}"

[grpc]
  address = "{containerd_socket()}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{root / 'opt'}"

[{cri}]
  sandbox_image = "{_nodeimages().PAUSE_IMAGE}"
  # No CAP_SYS_RESOURCE here: without this runc fails every sandbox with
  # "can't get final child's PID from pipe: EOF" (it may not lower oom_score_adj).
  restrict_oom_score_adj = true
  # Pod network namespaces under run/, so down() finds and removes them all.
  netns_mounts_under_state_dir = true

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{run / 'runc'}"

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{cni_dir}"
"""
    path = c.dir / "containerd.toml"
    path.write_text(toml)
    return path


def _start_containerd(c: Cluster) -> None:
    cfg = _containerd_config(c)
    containerd_socket().unlink(missing_ok=True)
    _spawn(c, "containerd", [f"--config={cfg}", "--log-level=warn"], exe=Path(shutil.which("containerd")))


def _wait_containerd(c: Cluster) -> None:
    sock = containerd_socket()
    _wait("containerd", lambda: sock.exists() and _nodeimages().ctr(sock, "version").returncode == 0,
          30, c, "containerd")


def _import_image(c: Cluster, build, ref: str, name: str) -> None:
    ni = _nodeimages()
    archive = c.dir / "images" / f"{name}.tar"
    digest = build(archive)
    ni.import_archive(containerd_socket(), archive, ref, digest)


def start_real_node(c: Cluster) -> None:
    """kubelet, kube-proxy and CoreDNS against the running apiserver; wait for Ready."""
    pki = c.dir / "pki"
    ca = pki / "ca.crt"
    run = node_root() / "run"
    for name in ("kubelet", "kube-proxy"):
        write_kubeconfig(c.dir / f"{name}.kubeconfig", c.server, ca, cert=pki / f"{name}.crt",
                         key=pki / f"{name}.key")
    c.kubelet_port = free_port()
    c.ports = {"kubelet-healthz": free_port(), "kube-proxy-healthz": free_port(),
               "kube-proxy-metrics": free_port(), "coredns-ready": free_port(),
               "coredns-health": free_port()}
    c.save()
    _dns_service(c)
    _wait_containerd(c)
    _import_image(c, _nodeimages().build_pause, _nodeimages().PAUSE_IMAGE, "pause")
    kubelet_cfg = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": NODE_IP, "port": c.kubelet_port, "readOnlyPort": 0,
        "healthzBindAddress": LOOPBACK, "healthzPort": c.ports["kubelet-healthz"],
        "tlsCertFile": str(pki / "kubelet-serving.crt"), "tlsPrivateKeyFile": str(pki / "kubelet-serving.key"),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "AlwaysAllow"},  # any client cert of this cluster's CA
        # cgroup v1 and containerd 1.6, which lacks the CRI RuntimeConfig call.
        "cgroupDriver": "cgroupfs", "failCgroupV1": False, "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{containerd_socket()}",
        "clusterDNS": [DNS_SERVICE_IP], "clusterDomain": CLUSTER_DOMAIN,
        # The pause and test images are imported, never pulled: no image GC.
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%"},
        "podLogsDir": str(c.dir / "logs" / "pods"),
        "volumePluginDir": str(run / "kubelet-plugins"),
        "nodeStatusUpdateFrequency": "4s", "nodeStatusReportFrequency": "1m",
        "syncFrequency": "10s", "serializeImagePulls": False,
        "shutdownGracePeriod": "0s", "shutdownGracePeriodCriticalPods": "0s",
    }
    (c.dir / "kubelet.json").write_text(json.dumps(kubelet_cfg, indent=2))
    _spawn(c, "kubelet", [
        f"--config={c.dir / 'kubelet.json'}", f"--kubeconfig={c.dir / 'kubelet.kubeconfig'}",
        f"--root-dir={run / 'kubelet'}", f"--hostname-override={NODE_NAME}", f"--node-ip={NODE_IP}",
        f"--node-labels={REAL_NODE_LABEL}=real", "--v=0",
    ])
    proxy_cfg = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(c.dir / "kube-proxy.kubeconfig")},
        "mode": "nftables", "hostnameOverride": NODE_NAME, "clusterCIDR": NODE_CIDR,
        "healthzBindAddress": f"{LOOPBACK}:{c.ports['kube-proxy-healthz']}",
        "metricsBindAddress": f"{LOOPBACK}:{c.ports['kube-proxy-metrics']}",
        "nodePortAddresses": [f"{NODE_IP}/32"],
        # Leave the machine's conntrack sysctls alone.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
        # Service traffic is SNATed to the node IP, so a pod reaching a pod on the same
        # bridge through a ClusterIP gets its replies back through the host.
        "nftables": {"masqueradeAll": True, "syncPeriod": "30s", "minSyncPeriod": "0s"},
    }
    (c.dir / "kube-proxy.json").write_text(json.dumps(proxy_cfg, indent=2))
    _spawn(c, "kube-proxy", [f"--config={c.dir / 'kube-proxy.json'}", "--v=0"])
    corefile = f""".:53 {{
    bind {NODE_IP}
    errors
    health {LOOPBACK}:{c.ports['coredns-health']}
    ready {LOOPBACK}:{c.ports['coredns-ready']}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {c.kubeconfig} rlscale
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
    loadbalance
}}
"""
    # No forward plugin: names outside the cluster get REFUSED instead of a query to the
    # machine's upstream resolver (pods here talk only to addresses on this machine).
    (c.dir / "Corefile").write_text(corefile)
    _spawn(c, "coredns", ["-conf", str(c.dir / "Corefile")])
    _wait("kubelet to register the node", lambda: _node_ready(c) is not None, 90, c, "kubelet")
    _wait("CoreDNS ready", lambda: _http_ok(c.ports["coredns-ready"], "/ready"), 60, c, "coredns")
    _wait("kube-proxy healthz", lambda: _http_ok(c.ports["kube-proxy-healthz"], "/healthz"), 60, c,
          "kube-proxy")
    _wait("node Ready", lambda: _node_ready(c) is True, 120, c, "kubelet")


def _http_ok(port: int, path: str) -> bool:
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}{path}", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _node_ready(c: Cluster) -> bool | None:
    """None while the node is not registered, else whether it is Ready."""
    out = c.kubectl("get", "node", NODE_NAME, "-o", "json", check=False, timeout=10)
    if out.returncode != 0:
        return None
    conds = json.loads(out.stdout).get("status", {}).get("conditions", [])
    return any(x["type"] == "Ready" and x["status"] == "True" for x in conds)


def _dns_service(c: Cluster) -> None:
    """kube-system/kube-dns at DNS_SERVICE_IP, endpoints by hand: CoreDNS is a host process
    on the node IP, so the kubelet's clusterDNS is the usual Service IP."""
    ports = [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]
    objs = [
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
         "spec": {"clusterIP": DNS_SERVICE_IP, "ports": [{**p, "targetPort": 53} for p in ports]}},
        {"apiVersion": "v1", "kind": "Endpoints",
         "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
         "subsets": [{"addresses": [{"ip": NODE_IP}], "ports": ports}]},
    ]
    # kube-system appears a moment after /readyz.
    deadline = time.monotonic() + 30
    while True:
        out = c.kubectl("apply", "-f", "-", check=False,
                        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
        if out.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"kube-dns Service: {out.stderr.strip()}")
        time.sleep(0.5)


def _containers_purge(sock: Path) -> None:
    """Kill and delete every container (pods and sandboxes) in containerd's k8s.io namespace."""
    ni = _nodeimages()
    try:
        tasks = ni.ctr(sock, "tasks", "ls", "-q", timeout=20)
        for tid in tasks.stdout.split() if tasks.returncode == 0 else []:
            ni.ctr(sock, "tasks", "kill", "-s", "SIGKILL", tid, timeout=20)
        for tid in tasks.stdout.split() if tasks.returncode == 0 else []:
            ni.ctr(sock, "tasks", "delete", "-f", tid, timeout=20)
        ctrs = ni.ctr(sock, "containers", "ls", "-q", timeout=20)
        ids = ctrs.stdout.split() if ctrs.returncode == 0 else []
        if ids:
            ni.ctr(sock, "containers", "delete", *ids, timeout=60)
    except subprocess.TimeoutExpired:
        pass


def _cgroup_dirs() -> list[Path]:
    """The kubelet's pod cgroups (cgroupfs driver, root /) in every v1 hierarchy."""
    base = Path("/sys/fs/cgroup")
    return [d / "kubepods" for d in base.iterdir() if (d / "kubepods").is_dir()] if base.is_dir() else []


def _kill_pids(pids: set[int]) -> None:
    for pid in pids:
        if pid > 1 and pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _umount_under(root: Path) -> None:
    """Detach every mount at or below root, deepest first."""
    libc = ctypes.CDLL(None, use_errno=True)
    prefix = str(root)
    for _ in range(3):
        try:
            lines = Path("/proc/self/mountinfo").read_text().splitlines()
        except OSError:
            return
        points = []
        for line in lines:
            mp = line.split()[4].replace("\\040", " ")
            if mp == prefix or mp.startswith(prefix + "/"):
                points.append(mp)
        if not points:
            return
        for mp in sorted(set(points), key=len, reverse=True):
            libc.umount2(mp.encode(), 2)  # MNT_DETACH


def _iptables_sweep() -> None:
    """Remove the KUBE-* chains the kubelet and kube-proxy made in iptables (v4 and v6)."""
    for tool in ("iptables", "ip6tables"):
        if not shutil.which(tool):
            continue
        for table in ("filter", "nat", "mangle"):
            out = _run(tool, "-w", "-t", table, "-S", check=False)
            if out.returncode != 0:
                continue
            rules = out.stdout.splitlines()
            chains = [r.split()[1] for r in rules if r.startswith("-N KUBE-")]
            if not chains:
                continue
            for r in rules:
                parts = r.split()
                if parts[:1] == ["-A"] and not parts[1].startswith("KUBE-") and any(
                        p.startswith("KUBE-") for p in parts[2:]):
                    _run(tool, "-w", "-t", table, "-D", *parts[1:], check=False)
            for ch in chains:
                _run(tool, "-w", "-t", table, "-F", ch, check=False)
            for ch in chains:
                _run(tool, "-w", "-t", table, "-X", ch, check=False)


def node_cleanup() -> None:
    """Undo everything a real node may have left, running or killed: pod processes, shims,
    mounts and netns under node/run, the bridge, kube-proxy's nftables tables, KUBE-*
    iptables chains, pod cgroups; restores ip_forward. Keeps containerd's root (images)."""
    root, run = node_root(), node_root() / "run"
    sock = str(containerd_socket())
    procs: set[int] = set()
    for cg in _cgroup_dirs():
        for f in cg.rglob("cgroup.procs"):
            try:
                procs.update(int(x) for x in f.read_text().split())
            except (OSError, ValueError):
                pass
    # containerd-shim-runc-v2 outlives containerd; ours name our socket in their argv.
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and sock.encode() in argv:
            procs.add(int(p.name))
    _kill_pids(procs)
    time.sleep(0.2 if procs else 0)
    _umount_under(run)
    for cg in _cgroup_dirs():
        for d in sorted((x for x in cg.rglob("*") if x.is_dir()), key=lambda x: len(x.parts), reverse=True):
            try:
                d.rmdir()
            except OSError:
                pass
        try:
            cg.rmdir()
        except OSError:
            pass
    if shutil.which("nft"):
        for fam in ("ip", "ip6"):
            _run("nft", "delete", "table", fam, "kube-proxy", check=False)
    _iptables_sweep()
    if shutil.which("ip"):
        _run("ip", "link", "del", NODE_BRIDGE, check=False)
    saved = run / "ip_forward.saved"
    if saved.exists():
        try:
            Path("/proc/sys/net/ipv4/ip_forward").write_text(saved.read_text())
        except OSError:
            pass
    if run.exists():
        shutil.rmtree(run, ignore_errors=True)
    for p in (Path(sock), Path(sock + ".ttrpc")):
        p.unlink(missing_ok=True)
    root.mkdir(parents=True, exist_ok=True)


def add_nodes(c: Cluster, count: int, gpus: int, prefix: str = "gpu-node") -> None:
    """Create fake GPU nodes and wait until kwok reports them Ready."""
    items = [node_manifest(f"{prefix}-{i}", gpus, beside_real_node=c.real_node) for i in range(count)]
    c.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    names = [f"node/{m['metadata']['name']}" for m in items]
    out = c.kubectl("wait", "--for=condition=Ready", "--timeout=90s", *names, check=False, timeout=100)
    if out.returncode != 0:
        raise ClusterError(f"fake nodes not Ready: {out.stderr.strip()}\nkwok log:\n{_tail(c.log('kwok'))}")


def apply_crds(c: Cluster) -> None:
    """Install the committed CRDs and wait until they are served."""
    files = sorted(CRD_DIR.glob("*.yaml"))
    if not files:
        print(f"note: no CRD in {CRD_DIR}; run `make crd`", file=sys.stderr)
        return
    for f in files:
        c.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f))
    c.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all", timeout=70)


def down(state_dir: Path | None = None) -> bool:
    """Stop the control plane recorded in state_dir; True when something was running."""
    state_dir = Path(state_dir or default_state_dir())
    c = Cluster.load(state_dir)
    if not c:
        return False
    if c.real_node:
        # The kubelet first (else it restarts what is killed), then the pods' containers
        # while containerd still answers, then containerd.
        _stop(c, ["kubelet", "kube-proxy", "coredns"])
        if _pid_alive(c.pids.get("containerd", 0)):
            _containers_purge(containerd_socket())
        _stop(c, ["containerd"])
    # etcd last and on its own: an apiserver with the lease endpoint reconciler removes
    # its endpoint at shutdown and waits for etcd to answer (15 s when etcd went first).
    _stop(c, [n for n in reversed(COMPONENTS) if n != "etcd"])
    _stop(c, ["etcd"])
    if c.real_node:
        try:
            holder = Path(_owner_file().read_text().strip())
        except OSError:
            holder = None
        if holder is None or holder == Path(c.dir):
            node_cleanup()
            _owner_file().unlink(missing_ok=True)
    (state_dir / "state.json").unlink(missing_ok=True)
    return True


def _stop(c: Cluster, names: list[str], grace: float = 15) -> None:
    """SIGTERM the named components together, SIGKILL what is left after grace seconds."""
    pids = [c.pids[n] for n in names if n in c.pids]
    for pid in pids:
        if _pid_alive(pid):
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
    deadline = time.monotonic() + grace
    for pid in pids:
        while _pid_alive(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.1)
        if _pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            _reap(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="start (or reuse) the control plane")
    u.add_argument("--dir", type=Path, default=None)
    u.add_argument("--nodes", type=int, default=int(os.environ.get("RLSCALE_FAKE_NODES", 4)))
    u.add_argument("--gpus-per-node", type=int, default=int(os.environ.get("RLSCALE_FAKE_GPUS", 8)))
    u.add_argument("--fresh", action="store_true", help="stop a running one and start anew")
    u.add_argument("--real-node", action=argparse.BooleanOptionalAction,
                   default=os.environ.get("RLSCALE_REAL_NODE", "0") not in ("", "0"),
                   help="also start a node that runs containers (containerd, kubelet, kube-proxy, "
                        "CoreDNS); one per machine")
    d = sub.add_parser("down", help="stop it")
    d.add_argument("--dir", type=Path, default=None)
    s = sub.add_parser("status", help="print the KUBECONFIG if it is running")
    s.add_argument("--dir", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.cmd == "up":
        t0 = time.monotonic()
        try:
            c = up(a.dir, a.nodes, a.gpus_per_node, reuse=not a.fresh, real_node=a.real_node)
        except ClusterError as e:
            print(f"cluster up failed: {e}", file=sys.stderr)
            return 1
        print(f"{'cluster' if c.real_node else 'control plane'} up in {time.monotonic() - t0:.1f}s: {c.server}, "
              f"{c.nodes} fake nodes x {c.gpus_per_node} {GPU_RESOURCE}, logs in {c.dir / 'logs'}",
              file=sys.stderr)
        if c.real_node:
            print(f"real node {c.node_name} at {c.node_ip} (label {REAL_NODE_LABEL}=real, pods in "
                  f"{NODE_CIDR}, DNS {DNS_SERVICE_IP}); import images with\n"
                  f"  ctr --address {c.containerd_socket} -n k8s.io images import IMAGE.tar",
                  file=sys.stderr)
            # ctr reads both: `ctr images import IMAGE.tar` then lands where the kubelet looks.
            print(f"export CONTAINERD_ADDRESS={c.containerd_socket}")
            print("export CONTAINERD_NAMESPACE=k8s.io")
        print(f"export KUBECONFIG={c.kubeconfig}")
        print(f"export PATH={bin_dir()}:$PATH")
        return 0
    if a.cmd == "down":
        print("stopped" if down(a.dir) else "nothing running", file=sys.stderr)
        return 0
    c = Cluster.load(Path(a.dir or default_state_dir()))
    if c and c.alive():
        print(f"export KUBECONFIG={c.kubeconfig}")
        return 0
    print("not running", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
