"""Operator at scale: apply N RLRuns at once on the loopback control plane and measure seconds
from each apply to its children being created (p50, p99) and the operator's peak RSS.

Baseline: the same children written straight to the API server by one client with no operator
(server-side apply, one run after another); the ratio says what the operator adds on top.

    .venv/bin/python bench/operator_scale.py [--runs 100]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
# hack.cluster lives in the checkout, not in the installed package; the root goes last on sys.path
# so that rlscale still comes from the install.
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from hack import cluster as cp  # noqa: E402
from hack.cluster import quickstart as qs  # noqa: E402


def small_run(name: str) -> dict:
    """The cluster example with a 1.5B model on two GPUs (one rollout, one learner), so N runs fit."""
    obj = yaml.safe_load((REPO / "examples" / "grpo-h100.yaml").read_text())
    obj["metadata"] = {"name": name, "namespace": "bench"}
    obj["spec"]["model"]["path"] = "Qwen/Qwen2.5-1.5B"
    obj["spec"]["budget"]["gpus"] = 2
    obj["spec"]["rollout"]["resources"] = {}
    obj["spec"]["learner"]["resources"] = {}
    return obj


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, int(round(q * (len(xs) - 1)))))
    return xs[k]


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_operator(cluster, state: Path, port: int) -> subprocess.Popen:
    """The operator as a local process watching namespace bench, logging to state/operator.log."""
    log = open(state / "operator.log", "wb")
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "RLSCALE_OPERATOR_BIND": "127.0.0.1",
           "RLSCALE_CHECKPOINT_STORAGE": "", "RLSCALE_LOG_LEVEL": "WARNING"}
    op = subprocess.Popen([sys.executable, "-m", "rlscale.operator", "--metrics-port", str(port),
                           "--namespace", "bench"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    time.sleep(3)  # let kopf list and start watching before the burst
    return op


def stop(op: subprocess.Popen) -> None:
    op.terminate()
    try:
        op.wait(20)
    except subprocess.TimeoutExpired:
        op.kill()


def burst(api, runs: int, timeout: float) -> tuple[dict[str, float], dict[str, float], float, float]:
    """Create `runs` RLRuns at once in namespace bench; returns (applied at, children created at,
    seconds the creates took, when the burst began), times from time.monotonic()."""
    from kubernetes import client, watch

    from rlscale.operator import constants as C

    co = client.CustomObjectsApi(api)
    created: dict[str, float] = {}
    applied: dict[str, float] = {}
    done = threading.Event()

    def watch_learners() -> None:
        # The learner StatefulSet is the last child the operator applies: its arrival = all created.
        w = watch.Watch()
        apps = client.AppsV1Api(api)
        for ev in w.stream(apps.list_namespaced_stateful_set, "bench", timeout_seconds=int(timeout)):
            name = ev["object"].metadata.labels.get(C.LABEL_RUN)
            if name and name not in created:
                created[name] = time.monotonic()
                if len(created) >= runs:
                    break
        done.set()

    threading.Thread(target=watch_learners, daemon=True).start()
    time.sleep(0.5)
    began = time.monotonic()
    for i in range(runs):
        run = small_run(f"run-{i:03d}")
        applied[run["metadata"]["name"]] = time.monotonic()
        co.create_namespaced_custom_object(C.GROUP, C.VERSION, "bench", C.PLURAL, run)
    apply_s = time.monotonic() - began
    done.wait(timeout)
    return applied, created, apply_s, began


def baseline_direct(api, kubeconfig: Path, runs: int) -> tuple[list[float], float]:
    """With no operator, one client creates each RLRun and server-side-applies the same children
    itself, one run after another; returns (seconds per run, seconds for all)."""
    from kubernetes import client

    from rlscale.operator import builders as B
    from rlscale.operator import constants as C
    from rlscale.operator.kube import Kube as OperatorClient
    from rlscale.operator.planning import plan_for
    from rlscale.spec import parse_spec

    # The operator's own client and its server-side apply (same field manager, one PATCH per child).
    children = OperatorClient(str(kubeconfig))
    co = client.CustomObjectsApi(api)
    per_run = []
    d0 = time.monotonic()
    for i in range(runs):
        run = small_run(f"direct-{i:03d}")
        run["metadata"]["namespace"] = "bench-direct"
        s = time.monotonic()
        obj = co.create_namespaced_custom_object(C.GROUP, C.VERSION, "bench-direct", C.PLURAL, run)
        spec = parse_spec(run["spec"])
        ref = B.RunRef(name=run["metadata"]["name"], namespace="bench-direct", uid=obj["metadata"]["uid"])
        for m in B.build_children(ref, spec, plan_for(spec)):
            children.apply(m)
        per_run.append(time.monotonic() - s)
    return per_run, time.monotonic() - d0


def summary(runs: int, applied: dict[str, float], created: dict[str, float], apply_s: float, began: float,
            rss: float, direct: list[float], direct_total: float) -> dict:
    lat = [created[n] - applied[n] for n in applied if n in created]
    res = {
        "runs": runs, "childrenCreated": len(lat), "missing": runs - len(lat),
        "applySeconds": round(apply_s, 2),
        "p50Seconds": round(percentile(lat, 0.5), 3) if lat else None,
        "p99Seconds": round(percentile(lat, 0.99), 3) if lat else None,
        "maxSeconds": round(max(lat), 3) if lat else None,
        "allCreatedSeconds": round(max(created.values()) - began, 2) if created else None,
        "operatorPeakRssMiB": round(rss, 1),
        "baselineDirectPerRunP50Seconds": round(statistics.median(direct), 3),
        "baselineDirectAllSeconds": round(direct_total, 2),
    }
    res["ratioAllVsDirect"] = round(res["allCreatedSeconds"] / direct_total, 2) if created else None
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args()
    from kubernetes import client, config

    state = Path(tempfile.mkdtemp(prefix="rlscale-bench-"))
    nodes = max(4, (2 * a.runs) // 8 + 2)
    t0 = time.monotonic()
    cluster = cp.up(state, nodes=nodes, gpus_per_node=8, reuse=False)
    print(f"control plane with {nodes} fake GPU nodes up in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    op = None
    try:
        kube = cp.Kube(cluster)
        for ns in ("bench", "bench-direct"):
            kube.apply(qs.namespace(ns))  # the operator runs no RLRun where no Pod Security Standard is enforced
        cfg = client.Configuration()
        config.load_kube_config(str(cluster.kubeconfig), client_configuration=cfg)
        api = client.ApiClient(cfg)
        op = start_operator(cluster, state, cp.free_port())
        applied, created, apply_s, began = burst(api, a.runs, a.timeout)
        # Let the status writes and readiness events of the burst settle, then read peak RSS.
        time.sleep(5)
        rss = peak_rss_mib(op.pid)
        stop(op)
        op = None
        direct, direct_total = baseline_direct(api, cluster.kubeconfig, a.runs)
        res = summary(a.runs, applied, created, apply_s, began, rss, direct, direct_total)
        print(f"{a.runs} RLRuns: apply->children p50 {res['p50Seconds']} s, p99 {res['p99Seconds']} s; "
              f"all children {res['allCreatedSeconds']} s after the first apply; operator peak RSS "
              f"{res['operatorPeakRssMiB']} MiB. Baseline (no operator: one client writes the same RLRuns and "
              f"children in sequence): {res['baselineDirectAllSeconds']} s for all, "
              f"{res['baselineDirectPerRunP50Seconds']} s per run (p50); operator/baseline x{res['ratioAllVsDirect']}")
        print(json.dumps(res))
        return 0 if res["missing"] == 0 else 1
    finally:
        if op is not None:
            stop(op)
        cp.down(state)


if __name__ == "__main__":
    sys.exit(main())
