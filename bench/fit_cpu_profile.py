"""Fit the cpu profile's efficiency numbers (rlscale/plan/profiles.py) to the quickstart's default sweep.

Reads tests/plan/data/cpu_quickstart_measured.json's "sweep" (median phase seconds of the quickstart at 8, 16, 32 and
64 prompts x 8 samples under two lr rules, and one held-out eval, with the command that measured them) and fits, by
least squares through the planner's own phase formulas (rlscale/plan/throughput.py), the relative residuals: each row
is weighted by 1/measured, so a 0.14 s phase counts as much as a 1.1 s one, as they do in the plan's ratios.

- generation: the four batches (each the mean of its two rules) and the 500-prompt greedy eval, five rows for two
  unknowns: 1/decode_flops_efficiency (prefill and decode compute scale as 1/e) and decode_iteration_overhead_s o.
  Every row decodes about 4 iterations (maxNewTokens 4 and the longest of 64-512 responses), so o and
  generate_overhead_s g enter every row as the one constant 4 o + g: these data fix their sum only. g stays the
  profile's, measured apart (docs/measurements.md, "The `cpu` accelerator profile").
- training: the four batches for two unknowns, 1/train_mfu and train_step_overhead_s (a step's fixed cost). Every
  batch is a multiple of microBatch 64, so micro_batch_overhead_s is proportional to the compute here, fixed by
  nothing in these data: it stays the profile's.
- sync: one unknown, sync_latency_s: the mean measured sync less the model's transfer seconds (the same every batch).
- reward: one unknown, reward_seconds_per_sample, by relative least squares through the origin.

Prints the fitted numbers and, per batch, each phase measured against profiles.py's cpu profile and the fit.

    .venv/bin/python bench/fit_cpu_profile.py
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "plan" / "data" / "cpu_quickstart_measured.json"
EVAL_PROMPTS = 500  # rlscale.plan.decision.EVAL_PROMPTS: one held-out eval, one greedy sample a prompt
PHASES = ("generate", "reward", "train", "sync")


def quickstart_model():
    from rlscale.plan.decision import system_model
    from rlscale.spec import parse_rlrun

    spec = parse_rlrun(yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())).spec
    return system_model(spec)


def batches(sweep: dict) -> dict[int, dict[str, float]]:
    """Per batch (prompts), the mean of each phase over the sweep's lr rules: the rules change the lr, not the work."""
    by: dict[int, list[dict]] = {}
    for row in sweep["phases"]:
        by.setdefault(row["prompts"], []).append(row)
    return {p: {ph: statistics.fmean(r[ph] for r in rows) for ph in PHASES} for p, rows in sorted(by.items())}


def least_squares(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(u, v) minimising sum ((a u + b v - y) / y)^2 over rows (a, b, y): relative residuals."""
    saa = sab = sbb = say = sby = 0.0
    for a, b, y in rows:
        a, b, w = a / y, b / y, 1.0
        saa, sab, sbb, say, sby = saa + a * a, sab + a * b, sbb + b * b, say + a * w, sby + b * w
    det = saa * sbb - sab * sab
    if abs(det) <= 1e-12 * saa * sbb:
        raise ValueError("the fit's two columns are proportional: these rows cannot separate its two unknowns")
    return (say * sbb - sby * sab) / det, (saa * sby - sab * say) / det


def linear_columns(seconds: Callable[[object], float], profile, slope: str, const: str):
    """seconds(profile) = base + slope_col * (1/slope) + const_col * const, read off the planner's formula."""
    zero = replace(profile, **{slope: 1e12, const: 0.0})
    base = seconds(zero)
    slope_col = seconds(replace(zero, **{slope: 1.0})) - base
    const_col = seconds(replace(zero, **{const: 1.0})) - base
    return base, slope_col, const_col


def fit(sweep: dict) -> dict[str, float]:
    """The fitted profile numbers for `sweep` (the data file's "sweep")."""
    m = quickstart_model()
    spp = sweep["samples_per_prompt"]
    measured = batches(sweep)

    def gen(prompts: int, n: int) -> Callable[[object], float]:
        return lambda profile: replace(m, profile=profile).generation(prompts, n, 1).seconds

    cases = [(gen(p, spp), ph["generate"]) for p, ph in measured.items()] + [(gen(EVAL_PROMPTS, 1), sweep["eval"])]
    rows = []
    for seconds, y in cases:
        base, a, b = linear_columns(seconds, m.profile, "decode_flops_efficiency", "decode_iteration_overhead_s")
        rows.append((a, b, y - base))
    inv_e, o = least_squares(rows)

    rows = []
    for p, ph in measured.items():
        def train(profile, n=p * spp):
            return replace(m, profile=profile).train_seconds(n, 1)
        base, a, b = linear_columns(train, m.profile, "train_mfu", "train_step_overhead_s")
        rows.append((a, b, ph["train"] - base))
    inv_mfu, fixed = least_squares(rows)

    transfer = m.sync_seconds(1, 1) - m.profile.sync_latency_s
    latency = statistics.fmean(ph["sync"] for ph in measured.values()) - transfer
    # sum ((n r - y) / y)^2 is least at r = sum(n / y) / sum((n / y)^2)
    ratios = [p * spp / ph["reward"] for p, ph in measured.items()]
    reward = sum(ratios) / sum(x * x for x in ratios)
    return {"decode_flops_efficiency": 1.0 / inv_e, "decode_iteration_overhead_s": o,
            "train_mfu": 1.0 / inv_mfu, "train_step_overhead_s": fixed, "sync_latency_s": latency,
            "reward_seconds_per_sample": reward}


def predicted(profile, sweep: dict) -> dict[int | str, dict[str, float]]:
    """Per batch, the phases `profile` predicts for the quickstart; under "eval", one held-out eval."""
    # system_model copies the profile's reward seconds into the model (a plugin reward has its own)
    m = replace(quickstart_model(), profile=profile, reward_seconds_per_sample=profile.reward_seconds_per_sample)
    spp = sweep["samples_per_prompt"]
    out: dict[int | str, dict[str, float]] = {}
    for p in batches(sweep):
        out[p] = m.phases(p, spp, 1, 1).to_dict()
    out["eval"] = {"generate": m.generation(EVAL_PROMPTS, 1, 1).seconds}
    return out


def main() -> int:
    from rlscale.plan import PROFILES

    sweep = json.loads(DATA.read_text())["sweep"]
    fitted = fit(sweep)
    for key, value in fitted.items():
        print(f"{key} = {value:.4g}   (profiles.py: {getattr(PROFILES['cpu'], key):.4g})")
    now, new = predicted(PROFILES["cpu"], sweep), predicted(replace(PROFILES["cpu"], **fitted), sweep)
    measured = batches(sweep)
    measured_eval: dict[int | str, dict[str, float]] = {"eval": {"generate": sweep["eval"]}}
    print(f"\n{'batch':>8} {'phase':>8} {'measured':>9} {'profile':>8} {'resid':>7} {'fit':>8} {'resid':>7}")
    for key, phases in {**measured, **measured_eval}.items():
        label = f"{key}x{sweep['samples_per_prompt']}" if key != "eval" else f"eval {EVAL_PROMPTS}"
        for phase, y in phases.items():
            a, b = now[key][phase], new[key][phase]
            print(f"{label:>8} {phase:>8} {y:9.4f} {a:8.4f} {a / y - 1:+7.1%} {b:8.4f} {b / y - 1:+7.1%}")
        if key != "eval":
            y, a, b = (sum(d[key][ph] for ph in PHASES) for d in (measured, now, new))
            n = key * sweep["samples_per_prompt"]
            print(f"{label:>8} {'step':>8} {y:9.4f} {a:8.4f} {a / y - 1:+7.1%} {b:8.4f} {b / y - 1:+7.1%}"
                  f"   samples/s {n / y:.0f} measured, {n / a:.0f} profile, {n / b:.0f} fit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
