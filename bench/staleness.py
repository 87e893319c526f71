"""The quickstart generating ahead of the learner (spec.algorithm.maxStaleness) against the synchronous
loop, on this machine's CPU, one after the other with the same spec and seed. Baseline: staleness 0
(generate, score, train, publish in turn; every process may use every core). Against it: staleness 1 and
2 (`rlscale run --staleness K`), where the rollout generates the next batch while the learner trains,
each on its own cores (rlscale/cpu_split.py). `--steps` steps each (the target set out of reach); it
prints the median samples/s, step and phase seconds over the second half of the steps and each K's
samples/s over K = 0's as a ratio. `--to-target` runs each to the quickstart's target instead and prints
samples- and time-to-target too, per seed (`--seeds 0,1,2`, `rlscale run --seed`) and their median. Each
run's step records carry the plan's predicted step (printed next to the measured one), and the K that
`rlscale plan` chooses when it may (maxStaleness the largest K, not pinned) is printed next to the K that
measured faster, and so is the planner calibrated on the synchronous runs' steps (as a run calibrates
itself), with its predicted samples/s ratio beside the measured one. `--is-cap C` sets algorithm.isCap
for the runs ahead (K > 0), which train on samples a version old.

    .venv/bin/python bench/staleness.py                      # 40 steps at K = 0, 1
    .venv/bin/python bench/staleness.py --staleness 0,1 --to-target --seeds 0,1,2 --is-cap 2 --prompts 32
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from pathlib import Path

from quickstart_runs import planned, quickstart_spec, run_quickstart, summary


def _change(top: int, is_cap: float | None, prompts: int | None = None):
    def change(s: dict) -> None:
        s["placement"] = "disaggregated"
        s["algorithm"]["maxStaleness"] = top
        if is_cap is not None:
            s["algorithm"]["isCap"] = is_cap
        if prompts:
            s["batch"]["prompts"] = prompts
    return change


def run(work: Path, k: int, top: int, steps: int, to_target: bool, seed: int = 0,
        is_cap: float | None = None, prompts: int | None = None) -> list[dict]:
    # The baseline is the synchronous loop as a user runs it, maxStaleness 0: rlscale run splits the cores
    # whenever the spec lets the rollout run ahead, so a K=0 pin under maxStaleness 1 would time the loop
    # confined to one core per phase (0.85 s a step against 0.70 s on both: x1.62 instead of x1.21).
    return run_quickstart(work, f"bench-k{k}-s{seed}", _change(top if k else 0, is_cap if k > 0 else None, prompts),
                          steps, to_target, ("--staleness", str(k), "--seed", str(seed)))


def planner_verdict(plan: dict, res: dict, ks: list[int], seeds: list[int], to_target: bool) -> None:
    """The staleness `rlscale plan` chose with maxStaleness max(ks) (unpinned) and its reason, next to the
    K that measured faster: by median time-to-target when the runs reached it, else by samples/s."""
    sentence = next((p.strip() for p in plan["reason"].split(". ") if p.strip().startswith("Staleness")),
                    f"staleness {plan['staleness']}")
    print(f"planner (uncalibrated, rlscale plan): {sentence}")
    key = "time_to_target_seconds" if to_target else "samples_per_second"
    got = {k: _median([res[k, s][key] for s in seeds]) for k in ks}
    if any(v is None for v in got.values()):
        print("measured: a run missed the target, no faster side to compare")
        return
    best = (min if to_target else max)(got, key=got.get)
    print(f"measured faster by median {key}: K={best}; the planner's choice "
          f"{'matches' if best == plan['staleness'] else 'differs'}")


def calibrated_verdict(sync_records: list[dict], ks: list[int], res: dict, seeds: list[int],
                       prompts: int | None = None) -> None:
    """The planner calibrated as a run calibrates itself, on the synchronous runs' steps (second half, every
    seed): the staleness it chooses and its predicted samples/s over K = 0's, next to the measured ratio."""
    from rlscale.cpu_split import available_cpus
    from rlscale.plan import Calibration, make_plan
    from rlscale.records import StepRecord
    from rlscale.spec import parse_rlrun

    recs = [StepRecord.from_dict(r) for r in sync_records]
    cal = Calibration.from_steps(recs, last=len(recs), noise_last=len(recs))
    spec = parse_rlrun(quickstart_spec("bench-plan", _change(max(ks), None, prompts))).spec
    plan = make_plan(spec, cal, host_cores=len(available_cpus()))
    sps = {c.staleness: c.predicted.samples_per_second for c in plan.candidates
           if (c.prompts, c.rollout_replicas) == (plan.prompts, plan.rollout_replicas)}
    for k in ks[1:]:
        measured = statistics.median(res[k, s]["samples_per_second"] / res[0, s]["samples_per_second"] for s in seeds)
        if k in sps and 0 in sps:
            print(f"planner (calibrated on the K=0 steps): K={k} / K=0 samples per second predicted "
                  f"x{sps[k] / sps[0]:.2f}, measured x{measured:.2f}")
    print(f"planner (calibrated on the K=0 steps) chooses staleness {plan.staleness}")


def _cell(x) -> str:
    return f"{'-' if x is None else round(x, 3):>10}"


def _median(xs: list) -> float | None:
    got = [x for x in xs if x is not None]
    return statistics.median(got) if len(got) == len(xs) and got else None  # a seed that missed: no median


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--staleness", default="0,1", help="comma-separated K values; 0 is the baseline")
    ap.add_argument("--to-target", action="store_true", help="run each to the quickstart's target")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds (rlscale run --seed)")
    ap.add_argument("--is-cap", type=float, default=None, help="algorithm.isCap of the runs with K > 0")
    ap.add_argument("--prompts", type=int, default=None,
                    help="batch.prompts of every run (default: each run's plan chooses, and may choose another "
                    "batch at K > 0: the comparison is then of the plans, not of the overlap alone)")
    ap.add_argument("--keep", type=Path, default=None,
                    help="write the runs (specs, logs, runs/NAME/metrics.jsonl) here instead of a temporary folder")
    a = ap.parse_args(argv)
    ks = sorted({0, *(int(x) for x in a.staleness.split(","))})
    seeds = [int(x) for x in a.seeds.split(",")]
    res: dict[tuple[int, int], dict] = {}
    sync_late: list[dict] = []  # the synchronous runs' second halves: what the calibrated planner reads
    work = contextlib.nullcontext(str(a.keep)) if a.keep else tempfile.TemporaryDirectory(prefix="rlscale-staleness-")
    with work as d:
        Path(d).mkdir(parents=True, exist_ok=True)
        plan = planned(Path(d), "bench-plan", _change(max(ks), None, a.prompts))
        for seed in seeds:  # seed by seed, the K values side by side: a drift in the machine hits them alike
            for k in ks:
                recs = run(Path(d), k, max(ks), a.steps, a.to_target, seed, a.is_cap, a.prompts)
                res[k, seed] = summary(recs)
                if k == 0:
                    sync_late += recs[len(recs) // 2:]
    for seed in seeds:
        print(f"seed {seed:<19}" + "".join(f"{'K=' + str(k):>10}" for k in ks))
        for key in ("samples_per_second", "step_seconds", "predicted_step_seconds", "generate_seconds",
                    "train_seconds", "sync_seconds", "wait_seconds", "steps", "samples_to_target",
                    "time_to_target_seconds"):
            print(f"{key:24}" + "".join(_cell(res[k, seed][key]) for k in ks))
    if len(seeds) > 1:
        print(f"median of {len(seeds)} seeds" + " " * 8 + "".join(f"{'K=' + str(k):>10}" for k in ks))
        for key in ("samples_per_second", "samples_to_target", "time_to_target_seconds"):
            print(f"{key:24}" + "".join(_cell(_median([res[k, s][key] for s in seeds])) for k in ks))
    for k in ks[1:]:
        ratio = statistics.median(res[k, s]["samples_per_second"] / res[0, s]["samples_per_second"] for s in seeds)
        print(f"K={k} / K=0, samples per second: x{ratio:.2f} (median of the second half of the steps"
              f"{', median over seeds' if len(seeds) > 1 else ''})")
        t0, tk = (_median([res[j, s]["time_to_target_seconds"] for s in seeds]) for j in (0, k))
        if t0 and tk:
            print(f"K={k} / K=0, median time to target: x{tk / t0:.2f} ({tk:.0f} s vs {t0:.0f} s)")
    planner_verdict(plan, res, ks, seeds, a.to_target)
    calibrated_verdict(sync_late, ks, res, seeds, a.prompts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
