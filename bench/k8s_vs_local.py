"""Seconds per step on Kubernetes vs on one machine: the same spec, the same machine, one run.

The quickstart on Kubernetes (examples/quickstart-k8s.yaml: the operator's own pods on the
local cluster's real node) for a fixed number of steps, then `rlscale run` of the same spec
(the embedded runner, local processes) for the same steps. Baseline: the embedded run. Both
stop on the step budget (the target is set out of reach), and the median step time over the
second half of each is compared; so are the seconds from start to the first step.

    .venv/bin/python bench/k8s_vs_local.py [--steps 60]

Needs `make k8s` and the real node free (no `make cluster` running): it starts its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
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
from rlscale.roles import Outcome  # noqa: E402


def wait(what: str, fn, timeout: float, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")


def read_records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def summary(recs: list[dict]) -> dict:
    second = recs[len(recs) // 2:]
    return {"steps": len(recs), "median_step_s": statistics.median(r["step_seconds"] for r in second),
            "median_generate_s": statistics.median(r["phases"]["generate"] for r in second),
            "median_train_s": statistics.median(r["phases"]["train"] for r in second)}


@contextlib.contextmanager
def operator_cluster(work: Path):
    """The local cluster with its real node, rlscale's images loaded and the chart installed (the
    operator running); taken down on exit."""
    c = cp.up(work / "cluster", nodes=0, install_crd=True, reuse=False, real_node=True)
    try:
        qs.build_and_load_images(c.containerd_socket)
        qs.helm_install(cp.bin_dir() / "helm", c.kubeconfig)
        yield cp.Kube(c)
    finally:
        cp.down(work / "cluster")


def run_ended(kube, name: str, ns: str) -> bool:
    """Whether the RLRun's phase says how it ended (Succeeded, BudgetExhausted, Failed)."""
    return (kube.get("rlrun", name, ns) or {}).get("status", {}).get("phase") in set(Outcome)


def on_kubernetes(work: Path, spec: dict) -> tuple[dict, float]:
    with operator_cluster(work) as kube:
        ns = "bench"
        kube.apply(qs.namespace(ns))
        kube.apply(qs.claims(ns, qs.model_cache(), work / "checkpoints"))
        t0 = time.monotonic()
        kube.apply(spec, ns)
        report = work / "checkpoints" / "report" / "metrics.jsonl"
        wait("the first step on Kubernetes", lambda: read_records(report), 1800)
        first = time.monotonic() - t0
        wait("the run on Kubernetes to end", lambda: run_ended(kube, spec["metadata"]["name"], ns), 3600)
        return summary(read_records(report)), first


def locally(work: Path, spec: dict) -> tuple[dict, float]:
    f = work / "local.yaml"
    f.write_text(yaml.safe_dump(spec))
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "rlscale.cli", "run", str(f), "--runs-dir", str(work / "runs"),
                             "--metrics-port", "0"], cwd=REPO, stdout=open(work / "local.log", "wb"),
                            stderr=subprocess.STDOUT)
    report = work / "runs" / spec["metadata"]["name"] / "metrics.jsonl"
    wait("the first local step", lambda: read_records(report) or proc.poll() is not None, 1800)
    first = time.monotonic() - t0
    proc.wait(timeout=3600)
    return summary(read_records(report)), first


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    a = ap.parse_args(argv)
    # The same spec both ways; a target out of reach, so both run exactly --steps steps.
    spec = qs.quickstart(target={"value": 0.99}, budget={"maxSteps": a.steps})
    spec["metadata"] = {"name": "bench-k8s"}
    with tempfile.TemporaryDirectory(prefix="rlscale-k8s-bench-") as d:
        work = Path(d)
        k8s, k8s_first = on_kubernetes(work, spec)
        local, local_first = locally(work, spec)
    print(f"{'':24}{'kubernetes':>12}{'rlscale run':>13}")
    for key in ("median_step_s", "median_generate_s", "median_train_s"):
        print(f"{key:24}{k8s[key]:12.3f}{local[key]:13.3f}")
    print(f"{'start to first step s':24}{k8s_first:12.1f}{local_first:13.1f}")
    print(f"kubernetes / rlscale run, seconds per step: x{k8s['median_step_s'] / local['median_step_s']:.2f} "
          f"(median of steps {a.steps // 2 + 1}-{a.steps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
