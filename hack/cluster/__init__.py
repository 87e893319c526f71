"""The local Kubernetes cluster the tests, the benches and `make cluster` use: a real control
plane on loopback (etcd, kube-apiserver, controller-manager, scheduler) with kwok fake GPU
nodes, and optionally a real node next to it (containerd, kubelet, kube-proxy and CoreDNS on a
host bridge). Every binary is built from Go modules by hack/cluster/build.sh.

    python -m hack.cluster up|down|status     (from the repository root)

The names below are the package's public interface; quickstart (which needs PyYAML) is imported
on its own: `from hack.cluster import quickstart`. Everything else is stdlib only, so plain
python3 runs the command line before any virtualenv exists."""

from __future__ import annotations

from . import nodeimages
from .config import (
    API_SERVICE_IP,
    CLUSTER_DOMAIN,
    DNS_SERVICE_IP,
    GPU_RESOURCE,
    NODE_BRIDGE,
    NODE_CIDR,
    NODE_IP,
    NODE_NAME,
    REAL_NODE_LABEL,
    ClusterError,
    bin_dir,
    cache_root,
    containerd_socket,
    default_state_dir,
    free_port,
    node_root,
    versions,
)
from .controlplane import Cluster, add_nodes, apply_crds, down, node_manifest, up
from .kubectl import Kube
from .pki import make_pki, write_kubeconfig
from .realnode import node_cleanup, start_real_node

__all__ = [
    "API_SERVICE_IP", "CLUSTER_DOMAIN", "DNS_SERVICE_IP", "GPU_RESOURCE", "NODE_BRIDGE", "NODE_CIDR",
    "NODE_IP", "NODE_NAME", "REAL_NODE_LABEL", "Cluster", "ClusterError", "Kube", "add_nodes",
    "apply_crds", "bin_dir", "cache_root", "containerd_socket", "default_state_dir", "down", "free_port",
    "make_pki", "node_cleanup", "node_manifest", "node_root", "nodeimages", "start_real_node", "up",
    "versions", "write_kubeconfig",
]
