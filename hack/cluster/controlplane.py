"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, controller-manager,
scheduler and kwok fake GPU nodes. Used by up.sh/down.sh and the pytest fixture."""

from __future__ import annotations

import argparse
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

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://{LOOPBACK}:{self.api_port}"

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
        return all(_pid_alive(self.pids.get(c, 0)) for c in COMPONENTS) and self.healthy()

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


def make_pki(pki: Path) -> None:
    """CA, apiserver serving cert (SAN 127.0.0.1), admin client cert, SA signing keys."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "3650", "-subj", "/CN=rlscale-local-ca", cwd=pki)
    sans = ("subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
            "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local")
    # system:masters makes the admin cert cluster-admin without any RBAC binding.
    for name, subj, ext in [
        ("apiserver", "/CN=kube-apiserver", sans + "\nextendedKeyUsage=serverAuth"),
        ("admin", "/O=system:masters/CN=rlscale-admin", "extendedKeyUsage=clientAuth"),
    ]:
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


def _spawn(c: Cluster, name: str, args: list[str]) -> int:
    exe = bin_dir() / name
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


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((LOOPBACK, port)) == 0


def node_manifest(name: str, gpus: int) -> dict:
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
        "spec": {},
        "status": {"capacity": cap, "allocatable": cap},
    }


def up(state_dir: Path | None = None, nodes: int = 4, gpus_per_node: int = 8,
       install_crd: bool = True, reuse: bool = True) -> Cluster:
    """Start (or reuse a healthy) control plane in state_dir and return it."""
    state_dir = Path(state_dir or default_state_dir())
    old = Cluster.load(state_dir)
    if reuse and old and old.alive():
        if install_crd:
            apply_crds(old)
        return old
    if old:
        down(state_dir)
    if state_dir.exists():
        shutil.rmtree(state_dir)
    (state_dir / "logs").mkdir(parents=True)
    c = Cluster(dir=state_dir, etcd_port=free_port(), etcd_peer_port=free_port(),
                api_port=free_port(), kwok_port=free_port(), nodes=nodes, gpus_per_node=gpus_per_node)
    c.save()
    try:
        _start(c)
        add_nodes(c, nodes, gpus_per_node)
        if install_crd:
            apply_crds(c)
    except BaseException:
        down(state_dir)
        raise
    return c


def _start(c: Cluster) -> None:
    pki = c.dir / "pki"
    make_pki(pki)
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
    _spawn(c, "kube-apiserver", [
        f"--etcd-servers={etcd_url}",
        f"--bind-address={LOOPBACK}", f"--advertise-address={LOOPBACK}", f"--secure-port={c.api_port}",
        # Loopback may not be an Endpoints address, and nothing needs that Service here.
        "--endpoint-reconciler-type=none",
        f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}", f"--cert-dir={c.dir / 'apiserver-certs'}",
        "--authorization-mode=RBAC",
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


def add_nodes(c: Cluster, count: int, gpus: int, prefix: str = "gpu-node") -> None:
    """Create fake GPU nodes and wait until kwok reports them Ready."""
    items = [node_manifest(f"{prefix}-{i}", gpus) for i in range(count)]
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
    pids = [c.pids[n] for n in reversed(COMPONENTS) if n in c.pids]
    for pid in pids:
        if _pid_alive(pid):
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
    deadline = time.monotonic() + 15
    for pid in pids:
        while _pid_alive(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.1)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
            _reap(pid)
    (state_dir / "state.json").unlink(missing_ok=True)
    return True


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
    d = sub.add_parser("down", help="stop it")
    d.add_argument("--dir", type=Path, default=None)
    s = sub.add_parser("status", help="print the KUBECONFIG if it is running")
    s.add_argument("--dir", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.cmd == "up":
        t0 = time.monotonic()
        try:
            c = up(a.dir, a.nodes, a.gpus_per_node, reuse=not a.fresh)
        except ClusterError as e:
            print(f"cluster up failed: {e}", file=sys.stderr)
            return 1
        print(f"control plane up in {time.monotonic() - t0:.1f}s: {c.server}, "
              f"{c.nodes} fake nodes x {c.gpus_per_node} {GPU_RESOURCE}, logs in {c.dir / 'logs'}",
              file=sys.stderr)
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
