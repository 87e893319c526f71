"""The quickstart colocated against disaggregated, on this machine's CPU, one after the other.

Baseline: `placement: disaggregated` (the rollout replica in a process of its own, the learner in
another). Colocated: the engine in a Serve replica on the learner's Ray node, no rollout process.
The same spec and seed both ways, `--steps` steps each (the target set out of reach so both run
exactly that many); it prints each side's median samples/s, step, generation and training seconds
over the second half of the steps, and colocated / disaggregated as a ratio. With --to-target
both run to the quickstart's target instead and it prints samples- and time-to-target.

On a CPU both placements share the same cores, so this measures the code path's overhead (weight
hand-over, sleep and wake are no-ops without a GPU), not what colocation saves on a GPU: there it
frees the rollout GPUs (docs/planner.md, "Placement").

    .venv/bin/python bench/placement.py                # 40 steps each
    .venv/bin/python bench/placement.py --to-target
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def run(work: Path, placement: str, steps: int, to_target: bool) -> list[dict]:
    spec = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    spec["metadata"] = {"name": f"bench-{placement}"}
    spec["spec"]["placement"] = placement
    if placement == "colocated":
        spec["spec"]["rollout"]["replicas"] = "auto"  # an engine per learner replica
    if not to_target:
        spec["spec"]["target"]["value"] = 0.999
        spec["spec"]["budget"]["maxSteps"] = steps
    f = work / f"{placement}.yaml"
    f.write_text(yaml.safe_dump(spec))
    log = work / f"{placement}.log"
    with open(log, "wb") as out:
        rc = subprocess.run([sys.executable, "-m", "rlscale.cli", "run", str(f), "--runs-dir", str(work / "runs"),
                             "--metrics-port", "0"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT).returncode
    records = work / "runs" / spec["metadata"]["name"] / "metrics.jsonl"
    if rc != 0 or not records.is_file():
        sys.exit(f"{placement}: rlscale run exited {rc}; see {log}:\n{log.read_text()[-3000:]}")
    return [json.loads(line) for line in records.read_text().splitlines() if line.strip()]


def summary(recs: list[dict]) -> dict:
    late = recs[len(recs) // 2:]
    med = lambda key: statistics.median(r[key] for r in late)  # noqa: E731
    phase = lambda name: statistics.median(r["phases"].get(name, 0.0) for r in late)  # noqa: E731
    reached = [r for r in recs if r.get("samples_to_target") is not None]
    return {"samples_per_second": med("samples_per_second"), "step_seconds": med("step_seconds"),
            "generate_seconds": phase("generate"), "train_seconds": phase("train"), "sync_seconds": phase("sync"),
            "steps": len(recs), "samples_to_target": reached[0]["samples_to_target"] if reached else None,
            "time_to_target_seconds": reached[0]["time_to_target_seconds"] if reached else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--to-target", action="store_true", help="run both to the quickstart's target")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rlscale-placement-") as d:
        res = {p: summary(run(Path(d), p, a.steps, a.to_target)) for p in ("disaggregated", "colocated")}
    print(f"{'':26}{'disaggregated':>14}{'colocated':>11}")
    for key in ("samples_per_second", "step_seconds", "generate_seconds", "train_seconds", "sync_seconds", "steps",
                "samples_to_target", "time_to_target_seconds"):
        row = [res[p][key] for p in ("disaggregated", "colocated")]
        cells = ("-" if v is None else round(v, 3) for v in row)
        print(f"{key:26}" + "".join(f"{c:>{w}}" for c, w in zip(cells, (14, 11), strict=True)))
    ratio = res["colocated"]["samples_per_second"] / res["disaggregated"]["samples_per_second"]
    print(f"colocated / disaggregated, samples per second: x{ratio:.2f} (median of the second half of the steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
