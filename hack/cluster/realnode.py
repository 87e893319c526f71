"""The real node next to the control plane: containerd + runc + a CNI bridge, kubelet,
kube-proxy (nftables), CoreDNS and kube-router's network policy controller (NetworkPolicy
enforcement: iptables and ipset) as host processes, one per machine (it owns a bridge,
nftables tables, iptables chains, ipsets and ports 53/kubelet), claimed by one cluster at a
time through the owner file in node_root(); and node_cleanup(), which undoes whatever a node
left. Stdlib only."""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from . import nodeimages as ni
from .config import (
    CLUSTER_DOMAIN,
    CNI_BIN_DIR,
    DNS_SERVICE_IP,
    LOOPBACK,
    NODE_BRIDGE,
    NODE_CIDR,
    NODE_IP,
    NODE_NAME,
    REAL_NODE_LABEL,
    SERVICE_CIDR,
    ClusterError,
    bin_dir,
    containerd_socket,
    free_port,
    node_root,
)
from .pki import write_kubeconfig
from .procs import pid_alive, spawn, stop, wait_until

if TYPE_CHECKING:
    from .controlplane import Cluster


# The node's own daemons, built by hack/cluster/build-node.sh.
NODE_BINARIES = ("kubelet", "kube-proxy", "coredns", "kube-router")
# kube-router's ipsets (its netpol controller's prefixes for a policy's source and destination
# pods); its iptables chains all start with KUBE- (KUBE-ROUTER-*, KUBE-NWPLCY-*, KUBE-POD-FW-*).
KUBE_ROUTER_IPSET_PREFIXES = ("KUBE-SRC-", "KUBE-DST-")


def _run(*cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise ClusterError(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    return out


def _owner_file() -> Path:
    return node_root() / "owner"


def check_node_prerequisites() -> None:
    """The host tools and built binaries a real node needs, or a ClusterError naming them."""
    missing = [x for x in ("containerd", "runc", "ctr", "nft", "ip", "gcc", "iptables", "iptables-save",
                           "iptables-restore", "ipset")
               if not shutil.which(x)] + [str(p) for p in (CNI_BIN_DIR / "bridge", CNI_BIN_DIR / "host-local")
                                         if not p.exists()]
    if missing:
        raise ClusterError(f"the real node needs {', '.join(missing)}: run `make k8s` "
                           "(it runs hack/cluster/node-deps.sh)")
    bins = [b for b in NODE_BINARIES if not (bin_dir() / b).exists()]
    if bins:
        raise ClusterError(f"{', '.join(bins)} missing in {bin_dir()}: run `make k8s` "
                           "and `bash hack/cluster/build-node.sh` (it builds kube-router)")


def node_holder() -> Path | None:
    """The state folder of the cluster that claimed the real node, if one did."""
    try:
        return Path(_owner_file().read_text().strip())
    except OSError:
        return None


def claim_node(state_dir: Path) -> None:
    """Tear down what an earlier node left (processes, mounts, netns, nft tables, bridge) and
    record state_dir as the node's holder; the caller made sure no live cluster holds it."""
    node_cleanup()
    node_root().mkdir(parents=True, exist_ok=True)
    _owner_file().write_text(f"{state_dir}\n")


def release_node(state_dir: Path) -> None:
    """node_cleanup() and drop the claim, unless another cluster holds the node."""
    holder = node_holder()
    if holder is None or holder == Path(state_dir):
        node_cleanup()
        _owner_file().unlink(missing_ok=True)


_IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
_BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


def node_network_up(c: Cluster) -> None:
    """The bridge with the node IP (the pods' gateway), made before the apiserver binds it."""
    run = node_root() / "run"
    run.mkdir(parents=True, exist_ok=True)
    if _run("ip", "link", "show", NODE_BRIDGE, check=False).returncode != 0:
        _run("ip", "link", "add", NODE_BRIDGE, "type", "bridge")
    prefix = NODE_CIDR.split("/")[1]
    _run("ip", "addr", "replace", f"{NODE_IP}/{prefix}", "dev", NODE_BRIDGE)
    _run("ip", "link", "set", NODE_BRIDGE, "up")
    # Service traffic DNATed to a pod on the same bridge is routed back out of it; and
    # traffic between two pods on the bridge passes the IPv4 hooks (iptables FORWARD), where
    # kube-router enforces NetworkPolicies, only with bridge-nf-call-iptables.
    if not _BRIDGE_NF.exists():
        _run("modprobe", "br_netfilter", check=False)
        if not _BRIDGE_NF.exists():
            raise ClusterError(f"{_BRIDGE_NF} is missing: the real node needs the br_netfilter "
                               "module (modprobe br_netfilter) to enforce NetworkPolicies")
    for knob, saved_name in ((_IP_FORWARD, "ip_forward.saved"), (_BRIDGE_NF, "bridge-nf-call-iptables.saved")):
        saved = run / saved_name
        if not saved.exists():
            saved.write_text(knob.read_text())
        knob.write_text("1\n")


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
    toml = f"""# Written by hack/cluster/realnode.py for the real node; containerd 1.6 (Debian 12).
version = 2
root = "{root / 'containerd'}"
state = "{run / 'containerd'}"

[grpc]
  address = "{containerd_socket()}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{root / 'opt'}"

[{cri}]
  sandbox_image = "{ni.PAUSE_IMAGE}"
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


def start_containerd(c: Cluster) -> None:
    cfg = _containerd_config(c)
    containerd_socket().unlink(missing_ok=True)
    spawn(c, "containerd", [f"--config={cfg}", "--log-level=warn"], exe=Path(shutil.which("containerd")))


def _wait_containerd(c: Cluster) -> None:
    sock = containerd_socket()
    wait_until("containerd", lambda: sock.exists() and ni.ctr(sock, "version").returncode == 0,
               30, c, "containerd")


def _import_image(c: Cluster, build, ref: str, name: str) -> None:
    archive = c.dir / "images" / f"{name}.tar"
    digest = build(archive)
    ni.import_archive(containerd_socket(), archive, ref, digest)


def start_real_node(c: Cluster) -> None:
    """kubelet, kube-proxy and CoreDNS against the running apiserver; wait for Ready; then
    kube-router's network policy controller, and wait for its iptables chains."""
    _node_credentials(c)
    _dns_service(c)
    _wait_containerd(c)
    _import_image(c, ni.build_pause, ni.PAUSE_IMAGE, "pause")
    _start_kubelet(c)
    _start_kube_proxy(c)
    _start_coredns(c)
    wait_until("kubelet to register the node", lambda: _node_ready(c) is not None, 90, c, "kubelet")
    wait_until("CoreDNS ready", lambda: _http_ok(c.ports["coredns-ready"], "/ready"), 60, c, "coredns")
    wait_until("kube-proxy healthz", lambda: _http_ok(c.ports["kube-proxy-healthz"], "/healthz"), 60, c,
               "kube-proxy")
    wait_until("node Ready", lambda: _node_ready(c) is True, 120, c, "kubelet")
    # After Ready: kube-router reads the node's InternalIP once, at start, and enforces
    # policies only for pods whose hostIP is that address.
    _start_kube_router(c)
    wait_until("kube-router's iptables chains", _kube_router_hooked, 60, c, "kube-router")


def _node_credentials(c: Cluster) -> None:
    """The kubelet's and kube-proxy's kubeconfigs, and the node's ports (saved in state.json)."""
    pki = c.dir / "pki"
    for name in ("kubelet", "kube-proxy"):
        write_kubeconfig(c.dir / f"{name}.kubeconfig", c.server, pki / "ca.crt", cert=pki / f"{name}.crt",
                         key=pki / f"{name}.key")
    c.kubelet_port = free_port()
    c.ports = {"kubelet-healthz": free_port(), "kube-proxy-healthz": free_port(),
               "kube-proxy-metrics": free_port(), "coredns-ready": free_port(),
               "coredns-health": free_port()}
    c.save()


def _start_kubelet(c: Cluster) -> None:
    pki = c.dir / "pki"
    ca = pki / "ca.crt"
    run = node_root() / "run"
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
        # Memory only: no disk signal. Below a disk threshold the kubelet reclaims space by deleting the
        # images no running container uses, and this node's images are imported, never pulled. In CI's
        # run of stop 48 the disk (252 GB, shared with other work) fell under the former 1% (2.5 GB) for
        # 44 s two minutes after the node started; the kubelet logged "able to reduce resource pressure
        # without evicting pods", and from then on every pod of the run waited on an image (48 tests
        # failed). A full disk now fails where it happens, with ENOSPC, and `make test` checks the free
        # space first (hack/disk.py).
        "evictionHard": {"memory.available": "100Mi"},
        "podLogsDir": str(c.dir / "logs" / "pods"),
        "volumePluginDir": str(run / "kubelet-plugins"),
        "nodeStatusUpdateFrequency": "4s", "nodeStatusReportFrequency": "1m",
        "syncFrequency": "10s", "serializeImagePulls": False,
        "shutdownGracePeriod": "0s", "shutdownGracePeriodCriticalPods": "0s",
    }
    (c.dir / "kubelet.json").write_text(json.dumps(kubelet_cfg, indent=2))
    spawn(c, "kubelet", [
        f"--config={c.dir / 'kubelet.json'}", f"--kubeconfig={c.dir / 'kubelet.kubeconfig'}",
        f"--root-dir={run / 'kubelet'}", f"--hostname-override={NODE_NAME}", f"--node-ip={NODE_IP}",
        f"--node-labels={REAL_NODE_LABEL}=real", "--v=0",
    ])


def _start_kube_proxy(c: Cluster) -> None:
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
    spawn(c, "kube-proxy", [f"--config={c.dir / 'kube-proxy.json'}", "--v=0"])


def _start_coredns(c: Cluster) -> None:
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
    spawn(c, "coredns", ["-conf", str(c.dir / "Corefile")])


def _start_kube_router(c: Cluster) -> None:
    """kube-router with only its network policy controller: no routing (the bridge routes),
    no service proxy (kube-proxy), no CNI config. It talks to the API server with the admin
    kubeconfig, as CoreDNS does; its health and metrics servers, which would listen on all
    addresses, are off."""
    spawn(c, "kube-router", [
        f"--kubeconfig={c.kubeconfig}", f"--hostname-override={NODE_NAME}",
        "--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
        "--run-loadbalancer=false", "--enable-cni=false", "--enable-ipv4=true", "--enable-ipv6=false",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--health-port=0", "--metrics-port=0", "--v=0",
    ])


def _kube_router_hooked() -> bool:
    """kube-router's FORWARD hook and its default policy chain exist (it made them after its
    caches synced, just before its first full sync)."""
    fwd = _run("iptables", "-w", "-t", "filter", "-S", "FORWARD", check=False)
    dflt = _run("iptables", "-w", "-t", "filter", "-S", "KUBE-NWPLCY-DEFAULT", check=False)
    return fwd.returncode == 0 and "-j KUBE-ROUTER-FORWARD" in fwd.stdout and dflt.returncode == 0


def _http_ok(port: int, path: str) -> bool:
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


def stop_node_components(c: Cluster) -> None:
    """The kubelet first (else it restarts what is killed), then the pods' containers while
    containerd still answers, then containerd."""
    stop(c, ["kubelet", "kube-proxy", "coredns", "kube-router"])
    if pid_alive(c.pids.get("containerd", 0)):
        _containers_purge(containerd_socket())
    stop(c, ["containerd"])


def _containers_purge(sock: Path) -> None:
    """Kill and delete every container (pods and sandboxes) in containerd's k8s.io namespace."""
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
                # shlex: kube-router's jumps carry comments with spaces ("kube-router netpol - ...").
                parts = shlex.split(r)
                if parts[:1] == ["-A"] and not parts[1].startswith("KUBE-") and any(
                        p.startswith("KUBE-") for p in parts[2:]):
                    _run(tool, "-w", "-t", table, "-D", *parts[1:], check=False)
            for ch in chains:
                _run(tool, "-w", "-t", table, "-F", ch, check=False)
            for ch in chains:
                _run(tool, "-w", "-t", table, "-X", ch, check=False)


def _ipset_sweep() -> None:
    """Destroy kube-router's ipsets (after _iptables_sweep removed the rules using them)."""
    if not shutil.which("ipset"):
        return
    out = _run("ipset", "list", "-n", check=False)
    for name in out.stdout.split() if out.returncode == 0 else []:
        if name.startswith(KUBE_ROUTER_IPSET_PREFIXES):
            _run("ipset", "destroy", name, check=False)


def node_cleanup() -> None:
    """Undo everything a real node may have left, running or killed: pod processes, shims,
    mounts and netns under node/run, the bridge, kube-proxy's nftables tables, KUBE-*
    iptables chains (the kubelet's and kube-router's), kube-router's ipsets, pod cgroups;
    restores ip_forward and bridge-nf-call-iptables. Keeps containerd's root (images)."""
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
    _ipset_sweep()
    if shutil.which("ip"):
        _run("ip", "link", "del", NODE_BRIDGE, check=False)
    for knob, saved_name in ((_IP_FORWARD, "ip_forward.saved"), (_BRIDGE_NF, "bridge-nf-call-iptables.saved")):
        saved = run / saved_name
        if saved.exists():
            try:
                knob.write_text(saved.read_text())
            except OSError:
                pass
    if run.exists():
        shutil.rmtree(run, ignore_errors=True)
    for p in (Path(sock), Path(sock + ".ttrpc")):
        p.unlink(missing_ok=True)
    root.mkdir(parents=True, exist_ok=True)

