"""The quickstart generating ahead of the learner on Kubernetes (spec.algorithm.maxStaleness 1) against
the synchronous loop (maxStaleness 0): the operator's own rollout and learner pods on the local cluster's
real node, one run after the other in one cluster.

Baseline: maxStaleness 0. Both runs use the same spec but for that field (and isCap 2 for the samples a
version old, as bench/staleness.py sets): examples/quickstart-k8s.yaml at 32 prompts x 8 samples (the
local quickstart's planned batch), disaggregated, `--steps` steps (the target set out of reach), and each
pod limited to one CPU (`resources.limits.cpu: 1` for the rollout and the learner pod), so that on a
2-core node the two pods have a core's worth each and overlapping them is not two pools of threads taking
turns. Each run has its own namespace and
checkpoint claim (a run never resumes from the other's checkpoint), and the second starts only after
the first's pods are gone. It prints the median samples/s, step and phase seconds over the second half
of the steps, the staleness the plan chose (and the versions behind each kept step trained), and
K=1 over K=0 as a ratio.

    .venv/bin/python bench/staleness_k8s.py [--steps 40]

Needs `make k8s images` and the real node free (no `make cluster` running): it starts its own.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

from k8s_vs_local import operator_cluster, qs, read_records, run_ended, wait
from quickstart_runs import summary

ONE_CPU = {"requests": {"cpu": "250m", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "4Gi"}}


def one_run(kube, work: Path, k: int, steps: int) -> tuple[dict, dict]:
    """The quickstart at maxStaleness k in namespace bench-k<k>: its summary and how far behind each
    kept step's batch was; the run and its pods are gone when this returns."""
    ns, name = f"bench-k{k}", f"bench-k{k}"
    algorithm = {"maxStaleness": k, **({"isCap": 2.0} if k else {})}
    spec = qs.quickstart(target={"value": 0.99}, budget={"maxSteps": steps}, algorithm=algorithm,
                         batch={"prompts": 32}, placement="disaggregated",
                         rollout={"resources": ONE_CPU}, learner={"resources": ONE_CPU})
    spec["metadata"] = {"name": name}
    kube.apply(qs.namespace(ns))
    kube.apply(qs.claims(ns, qs.model_cache(), work / f"checkpoints-k{k}"))
    kube.apply(spec, ns)
    report = work / f"checkpoints-k{k}" / "report" / "metrics.jsonl"
    wait(f"the run at maxStaleness {k} to end", lambda: run_ended(kube, name, ns), 3600, interval=5)
    recs = read_records(report)
    if not recs:  # what the operator and the pods said, before the run and its pods go
        print(json.dumps((kube.get("rlrun", name, ns) or {}).get("status", {}), indent=1), file=sys.stderr)
        print(kube.run("get", "events", "-n", ns, check=False).stdout, file=sys.stderr)
        for pod in kube.get("pods", ns=ns)["items"]:
            pod_name = pod["metadata"]["name"]
            logs = kube.run("logs", pod_name, "-n", ns, "--all-containers", "--tail", "40", check=False)
            print(f"--- {pod_name}\n{logs.stdout}{logs.stderr}", file=sys.stderr)
    kube.run("delete", "rlrun", name, "-n", ns, "--wait=false")
    wait(f"the pods of the run at maxStaleness {k} to go", lambda: not kube.get("pods", ns=ns)["items"], 600)
    if not recs:
        raise SystemExit(f"maxStaleness {k}: the run logged no step ({report})")
    return summary(recs), collections.Counter(r.get("staleness", 0) for r in recs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args(argv)
    res: dict[int, tuple[dict, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="rlscale-staleness-k8s-") as d:
        work = Path(d)
        with operator_cluster(work) as kube:
            for k in (0, 1):
                t0 = time.monotonic()
                res[k] = one_run(kube, work, k, a.steps)
                print(f"maxStaleness {k}: {res[k][0]['steps']} steps in {time.monotonic() - t0:.0f} s "
                      f"(start-up and teardown included)", flush=True)
    print(f"{'':24}{'K=0':>10}{'K=1':>10}")
    for key in ("samples_per_second", "step_seconds", "predicted_step_seconds", "generate_seconds",
                "train_seconds", "sync_seconds", "wait_seconds", "steps"):
        print(f"{key:24}" + "".join(f"{'-' if res[k][0][key] is None else round(res[k][0][key], 3):>10}"
                                    for k in (0, 1)))
    for k in (0, 1):
        behind = ", ".join(f"{v} behind: {n}" for v, n in sorted(res[k][1].items()))
        print(f"maxStaleness {k}: kept steps by versions behind: {behind}")
    ratio = res[1][0]["samples_per_second"] / res[0][0]["samples_per_second"]
    print(f"K=1 / K=0 on Kubernetes, samples per second: x{ratio:.2f} "
          f"(median of steps {a.steps // 2 + 1}-{a.steps}; pods limited to 1 CPU each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
