"""Fit the cpu profile's efficiency numbers (rlscale/plan/profiles.py) to the quickstart's measured phases.

Reads tests/plan/data/cpu_quickstart_measured.json (phase seconds of the quickstart at 32x8 and of one held-out
eval, with the command that measured them) and solves, through the planner's own phase formulas:

- generation, two measurements (a step's 32x8 = 256 sequences and an eval's 500 greedy prompts) for two unknowns:
  decode_flops_efficiency e (prefill and per-iteration compute scale as 1/e) and decode_iteration_overhead_s o
  (each decode iteration's fixed cost), at the profile's generate_overhead_s. Both are linear in (1/e, o).
- training, one measurement for one unknown: train_mfu, at the profile's micro_batch_overhead_s.

    .venv/bin/python bench/fit_cpu_profile.py
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "plan" / "data" / "cpu_quickstart_measured.json"


def quickstart_model():
    from rlscale.plan.decision import system_model
    from rlscale.spec import parse_rlrun

    spec = parse_rlrun(yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())).spec
    return system_model(spec)


def fit(measured: dict) -> dict[str, float]:
    """The fitted profile numbers for `measured` (the data file's "phases")."""
    m = quickstart_model()
    base = replace(m.profile, decode_iteration_overhead_s=0.0, generate_overhead_s=0.0)
    cases = [(measured["prompts"], measured["samples_per_prompt"], measured["generate"]), (500, 1, measured["eval"])]

    def gen(profile, prompts: int, spp: int) -> float:
        return replace(m, profile=profile).generation(prompts, spp, 1).seconds

    rows = []  # seconds - overhead = x * (1/e) + iterations * o
    for prompts, spp, seconds in cases:
        x = gen(replace(base, decode_flops_efficiency=1.0), prompts, spp)
        its = gen(replace(base, decode_iteration_overhead_s=1.0, decode_flops_efficiency=1e12), prompts, spp)
        rows.append((x, its, seconds - m.profile.generate_overhead_s))
    (x1, i1, y1), (x2, i2, y2) = rows
    det = x1 * i2 - x2 * i1
    inv_e, o = (y1 * i2 - y2 * i1) / det, (x1 * y2 - x2 * y1) / det
    # train = compute / mfu + the rest (micro-batch calls, the optimizer's traffic)
    one = replace(m, profile=replace(m.profile, train_mfu=1.0))
    n = measured["prompts"] * measured["samples_per_prompt"]
    compute = one.train_seconds(n, 1) - replace(one, profile=replace(one.profile, train_mfu=1e12)).train_seconds(n, 1)
    rest = one.train_seconds(n, 1) - compute
    return {"decode_flops_efficiency": 1.0 / inv_e, "decode_iteration_overhead_s": o,
            "train_mfu": compute / (measured["train"] - rest)}


def main() -> int:
    measured = json.loads(DATA.read_text())["phases"]
    for key, value in fit(measured).items():
        print(f"{key} = {value:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
