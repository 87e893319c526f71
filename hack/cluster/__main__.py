"""`python -m hack.cluster up|down|status` from the repository root (hack/cluster/up.sh and
down.sh run it): start, stop or look up the local cluster. Stdlib only."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from hack.cluster import __doc__ as PACKAGE_DOC
from hack.cluster.config import (
    DNS_SERVICE_IP,
    GPU_RESOURCE,
    NODE_CIDR,
    REAL_NODE_LABEL,
    ClusterError,
    bin_dir,
    default_state_dir,
)
from hack.cluster.controlplane import Cluster, down, up


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m hack.cluster", description=PACKAGE_DOC.split("\n\n")[0])
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
    return ap


def _up(a: argparse.Namespace) -> int:
    """Start the cluster; the progress goes to stderr, the lines to eval to stdout."""
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


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.cmd == "up":
        return _up(a)
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
