"""The quickstart generating ahead of the learner (spec.algorithm.maxStaleness) against the synchronous
loop, on this machine's CPU, one after the other with the same spec and seed.

Baseline: staleness 0 (generate, score, train, publish in turn; every process may use every core).
Against it: staleness 1 and 2 (`rlscale run --staleness K`), where the rollout generates the next batch
while the learner trains, each on its own cores (rlscale/cpu_split.py). `--steps` steps each (the target
set out of reach); it prints the median samples/s, step and phase seconds over the second half of the
steps and each K's samples/s over K = 0's as a ratio. `--to-target` runs each to the quickstart's target
instead and prints samples- and time-to-target too (one seed: seed-to-seed spread is the sweep's job,
`rlscale sweep --staleness 0,1 --seeds 0,1,2`).

    .venv/bin/python bench/staleness.py                      # 40 steps at K = 0, 1
    .venv/bin/python bench/staleness.py --staleness 0,1,2 --to-target
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from quickstart_runs import run_quickstart, summary


def run(work: Path, k: int, top: int, steps: int, to_target: bool) -> list[dict]:
    def change(s: dict) -> None:
        s["placement"] = "disaggregated"
        s["algorithm"]["maxStaleness"] = top
    return run_quickstart(work, f"bench-k{k}", change, steps, to_target, ("--staleness", str(k)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--staleness", default="0,1", help="comma-separated K values; 0 is the baseline")
    ap.add_argument("--to-target", action="store_true", help="run each to the quickstart's target")
    a = ap.parse_args(argv)
    ks = sorted({0, *(int(x) for x in a.staleness.split(","))})
    with tempfile.TemporaryDirectory(prefix="rlscale-staleness-") as d:
        res = {k: summary(run(Path(d), k, max(ks), a.steps, a.to_target)) for k in ks}
    print(f"{'':24}" + "".join(f"{'K=' + str(k):>10}" for k in ks))
    for key in ("samples_per_second", "step_seconds", "generate_seconds", "train_seconds", "sync_seconds",
                "wait_seconds", "steps", "samples_to_target", "time_to_target_seconds"):
        print(f"{key:24}" + "".join(f"{'-' if res[k][key] is None else round(res[k][key], 3):>10}" for k in ks))
    for k in ks[1:]:
        ratio = res[k]["samples_per_second"] / res[0]["samples_per_second"]
        print(f"K={k} / K=0, samples per second: x{ratio:.2f} (median of the second half of the steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
