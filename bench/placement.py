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
import sys
import tempfile
from pathlib import Path

from quickstart_runs import run_quickstart, summary


def run(work: Path, placement: str, steps: int, to_target: bool) -> list[dict]:
    def change(s: dict) -> None:
        s["placement"] = placement
        if placement == "colocated":
            s["rollout"]["replicas"] = "auto"  # an engine per learner replica
    return run_quickstart(work, f"bench-{placement}", change, steps, to_target)


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
