"""What the local cluster is made of and where it lives: addresses, component names, the
pinned versions, the cache folders, and the error its parts raise. Stdlib only."""

from __future__ import annotations

import os
import socket
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
NODE_COMPONENTS = ["containerd", "coredns", "kube-proxy", "kubelet", "kube-router"]
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
