"""The sweep's verdicts with intervals over seeds, its power, and the staleness penalty fitted from
synthetic sweeps with known answers: pure functions, no runs."""

from __future__ import annotations

import math

import pytest

from rlscale.records import StepRecord
from rlscale.spec import load_rlrun
from rlscale.sweep.analysis import BatchStats, RunData
from rlscale.sweep.patch import patch_dict
from rlscale.sweep.power import eval_prompts
from rlscale.sweep.report import analyse, markdown
from rlscale.sweep.runner import (
    Combo,
    SweepError,
    SweepState,
    combos,
    parse_staleness,
    run_sources,
    settings,
    staleness_rule,
)
from rlscale.sweep.staleness import fit_penalty, staleness_fit, staleness_verdict
from rlscale.sweep.stats import (
    bootstrap,
    fmt_ci,
    minimum_detectable_ratio,
    proportion_sd,
    ratio_ci,
    seed_sd,
    side,
    within,
)
from rlscale.sweep.verdict import claim_decision, claim_throughput, planner_verdict
from tests.plan.test_sweep_analysis import SPP, accuracy, sweep, synthetic_run


@pytest.fixture(scope="module")
def spec(request):
    return load_rlrun(request.config.rootpath / "examples" / "quickstart.yaml").spec


def cell(prompts: int, samples: dict, seconds: dict | None = None, throughput: dict | None = None,
         staleness: int = 0, rule: str = "sqrt") -> BatchStats:
    """A cell from per-seed numbers (seconds default to samples / throughput)."""
    throughput = throughput or {s: 100.0 for s in samples}
    seconds = seconds or {s: samples[s] / throughput[s] for s in samples}
    return BatchStats(rule=rule, prompts=prompts, batch=prompts * SPP, lr=1e-4, runs=[], level=0.5,
                      samples_to_level=list(samples.values()), seconds_to_level=list(seconds.values()),
                      throughput=sorted(throughput.values())[len(throughput) // 2], phases={}, noise_scale=None,
                      startup_seconds=None, staleness=staleness, seed_samples=samples, seed_seconds=seconds,
                      seed_throughput=throughput)


# --------------------------------------------------------------------------- intervals


def test_the_bootstrap_is_reproducible_and_covers_the_seeds():
    a, b = {0: 1.0, 1: 2.0, 2: 3.0}, {0: 1.0, 1: 1.0, 2: 1.0}
    ci = ratio_ci(a, b)
    assert ci == ratio_ci(a, b)  # a fixed random seed: the same runs give the same report
    assert 1.0 <= ci[0] < 2.0 < ci[1] <= 3.0
    assert bootstrap([7], lambda d: 5.0) == (5.0, 5.0)  # one seed: a single value
    assert bootstrap([], lambda d: 1.0) is None and fmt_ci((1.1, 1.1)) == ""


def test_an_interval_that_straddles_the_threshold_is_undecided():
    assert side((1.1, 1.3), 1.05) is True and side((0.8, 0.9), 1.0) is False
    assert side((0.9, 1.2), 1.0) is None
    assert side(None, 1.0, 1.2) is True  # no interval: the point decides
    assert within((0.95, 1.05), 0.87, 1.15) is True and within((1.2, 1.4), 0.87, 1.15) is False
    assert within((1.0, 1.3), 0.87, 1.15) is None


def test_throughput_that_rises_only_within_the_seed_scatter_is_inconclusive():
    small = cell(8, {0: 1e4, 1: 1e4}, throughput={0: 100.0, 1: 100.0})
    noisy = cell(64, {0: 1e4, 1: 1e4}, throughput={0: 90.0, 1: 130.0})
    v = claim_throughput([small, noisy])
    assert v.holds is None and "inconclusive" in v.text and "95% CI" in v.text
    clear = cell(64, {0: 1e4, 1: 1e4}, throughput={0: 150.0, 1: 160.0})
    assert claim_throughput([small, clear]).holds is True


def test_a_time_comparison_whose_interval_straddles_one_is_left_out():
    ref = cell(16, {0: 10_000.0, 1: 10_000.0}, throughput={0: 100.0, 1: 100.0})
    # 64 prompts: faster on seed 0, slower on seed 1; on average 12% faster
    big = cell(64, {0: 10_000.0, 1: 10_000.0}, seconds={0: 50.0, 1: 126.0}, throughput={0: 200.0, 1: 80.0})
    v = claim_decision([ref, big], 16, 0.15)
    assert v.holds is None and "inconclusive" in v.text, v.text
    sure = cell(64, {0: 10_000.0, 1: 10_000.0}, seconds={0: 50.0, 1: 55.0}, throughput={0: 200.0, 1: 180.0})
    assert claim_decision([ref, sure], 16, 0.15).holds is True
    alone = claim_decision([ref], 16, 0.15)  # one batch (a staleness sweep): nothing to compare, said so
    assert alone.holds is None and "needs a batch besides the reference" in alone.text


def test_the_planner_verdict_is_inconclusive_when_the_seeds_cannot_tell():
    seconds = {8: {0: 100.0, 1: 160.0}, 16: {0: 150.0, 1: 90.0}}
    v = planner_verdict(8, {8: 130.0, 16: 120.0}, None, seconds)
    assert v.holds is None and "cannot tell the two apart" in v.text
    apart = {8: {0: 200.0, 1: 210.0}, 16: {0: 100.0, 1: 105.0}}
    assert planner_verdict(8, {8: 205.0, 16: 102.5}, None, apart).holds is False


def test_invariance_with_scattered_seeds_carries_intervals(spec):
    # the seeds scatter at 64 prompts only: its ratio to the reference gets an interval, the others none
    runs = [synthetic_run(p, "sqrt", s, seed_jitter=0.5 if p == 64 else 0.0) for s in (0, 1) for p in (8, 16, 32, 64)]
    res = analyse("synthetic", spec, runs)
    a = {v.claim: v for v in res.verdicts}["a"]
    assert "64 prompts x1.00 (95% CI x0.7" in a.text, a.text
    assert "32 prompts x1.00," in a.text  # no scatter, no interval
    assert "from 8 to 32 prompts only" in a.text and "At 64 prompts the interval straddles the band's edge" in a.text
    assert res.power.seeds == 2 and res.power.detectable is not None and res.power.detectable > 1.2


# --------------------------------------------------------------------------- power


def test_power_formulas():
    assert proportion_sd(0.5, 100) == pytest.approx(0.05)
    assert seed_sd([[100.0, 100.0 * math.e], [5.0]]) == pytest.approx(math.sqrt(0.5))
    assert seed_sd([[1.0], [2.0]]) is None
    # sd 10% of log, 2 seeds a cell: exp(2.80 x 0.1 x 1) = x1.32
    assert minimum_detectable_ratio(0.1, 2) == pytest.approx(math.exp(2.801585 * 0.1), rel=1e-4)


def test_a_level_too_close_to_the_start_is_warned(spec):
    assert eval_prompts(spec) == 500  # the builtin 2-digit split
    short = [synthetic_run(p, "sqrt", s, samples=2048, eval_every=512, window=1) for s in (0, 1) for p in (8, 16)]
    res = analyse("short", spec, short)
    assert res.power.warning and "eval standard deviations" in res.power.warning
    assert "**Warning:" in markdown(res)
    full = analyse("full", spec, sweep(rules=("sqrt",)))
    assert full.power.warning is None and full.power.rise > 3 * full.power.eval_sd
    assert "## Power" in markdown(full) and full.power.detectable == pytest.approx(1.0)  # seeds that agree


# --------------------------------------------------------------------------- staleness


def test_the_penalty_is_fitted_through_the_origin():
    assert fit_penalty([(1, 1.1), (2, 1.21)]) == pytest.approx(0.1)
    assert fit_penalty([(0, 1.0)]) is None
    assert fit_penalty([(1, 0.9)]) == pytest.approx(-0.1)


def test_staleness_cells_give_the_penalty_with_its_interval():
    base = cell(16, {0: 10_000.0, 1: 11_000.0})
    k1 = cell(16, {0: 11_000.0, 1: 12_100.0}, throughput={0: 150.0, 1: 150.0}, staleness=1)
    k2 = cell(16, {0: 12_100.0, 1: 13_310.0}, throughput={0: 150.0, 1: 150.0}, staleness=2)
    fit = staleness_fit([base, k1, k2], "sqrt", {(16, 0): 100.0, (16, 1): 140.0, (16, 2): 140.0})
    assert fit.p == pytest.approx(0.1) and fit.points == 2 and fit.for_patch == pytest.approx(0.1)
    assert fit.ci[0] == pytest.approx(0.1) and fit.ci[1] == pytest.approx(0.1)  # both seeds agree
    assert fit.rows[0].predicted_gain == pytest.approx(1.4)
    v = staleness_verdict(fit)
    assert v.claim == "d" and v.holds is True and "p = 0.100" in v.text
    assert staleness_verdict(None).holds is None


def stale_run(prompts: int, seed: int, k: int, p: float, gain: float, samples: int = 32_768) -> RunData:
    """A synchronous run of the analysis tests' shape, its learning curve stretched by (1 + p)^k and its
    samples/s raised by gain (as staleness k would)."""
    run = synthetic_run(prompts, "sqrt", seed, samples=samples, window=1)
    recs = []
    for r in run.records:
        d = r.to_dict()
        d["step_seconds"] /= gain
        d["phases"] = {name: v / gain for name, v in d["phases"].items()}
        if d.get("eval") is not None:
            d["eval"] = accuracy(d["samples"] / (1 + p) ** k)
        recs.append(StepRecord.from_dict(d))
    return RunData(prompts, SPP, "sqrt", seed, run.lr, recs, window=1, staleness=k, source=f"p{prompts}-s{seed}-k{k}")


@pytest.mark.slow  # seconds of subprocesses or models: `make test`, not `make unit`
def test_a_sweep_with_staleness_fits_p_and_the_patch_carries_it(spec, tmp_path):
    runs = [stale_run(p, s, k, 0.1, 1.0 if k == 0 else 1.5) for s in (0, 1) for p in (8, 16) for k in (0, 1, 2)]
    res = analyse("stale", spec, runs)
    assert len(res.runs) == 4 and len(res.stale_runs) == 8  # the synchronous runs make the rest of the report
    assert res.staleness.p == pytest.approx(0.1, abs=0.03)  # the eval grid quantises the crossings a little
    d = {v.claim: v for v in res.verdicts}["d"]
    assert d.holds is True, d.text  # x1.5 throughput beats x1.1-x1.21 samples
    patch = patch_dict(res, "synthetic")
    assert patch["calibration"]["stalenessPenalty"] == pytest.approx(0.1, abs=0.03)
    assert patch["measured"]["stalenessFit"]["points"] == 4
    md = markdown(res)
    assert "## Staleness (rule sqrt)" in md and "(d) staleness" in md and "stalenessPenalty" in md
    assert "4 runs, and 8 more at staleness 1, 2 (section Staleness)" in md  # the header counts every run
    assert "![staleness](staleness.png)" in md
    assert "| rule | prompts | staleness | generate" in md and "| sqrt | 16 | 2 | " in md  # phases of every K
    from rlscale.sweep.plots import write_plots

    assert (tmp_path / "staleness.png") in write_plots(res, tmp_path)
    assert (tmp_path / "staleness.png").stat().st_size > 10_000


def test_staleness_runs_in_the_grid():
    assert parse_staleness("1,2") == [0, 1, 2] and parse_staleness("0") == [0]
    for bad in ("x", "9", "-1"):
        with pytest.raises(SweepError, match="--staleness"):
            parse_staleness(bad)
    cs = combos([8, 16], ["sqrt", "none"], 2, [0, 1], "sqrt")
    assert len(cs) == 12 and sum(c.staleness == 1 for c in cs) == 4
    assert all(c.rule == "sqrt" for c in cs if c.staleness)
    assert Combo(8, "sqrt", 0, 1).run_name("q") == "q-p8-sqrt-s0-k1"
    assert Combo(8, "sqrt", 0).run_name("q") == "q-p8-sqrt-s0"  # the names of sweeps before --staleness
    assert combos([8], ["sqrt"], 1) == [Combo(8, "sqrt", 0)]


def test_a_staleness_run_is_its_own_run(spec):
    src = run_sources(spec, combos([16], ["sqrt", "none"], 1, [0, 1], staleness_rule(spec, ["sqrt", "none"])))
    assert src[Combo(16, "none", 0)] == Combo(16, "sqrt", 0)  # the reference batch's shared run
    assert src[Combo(16, "sqrt", 0, 1)] == Combo(16, "sqrt", 0, 1)


def test_resume_refuses_another_staleness(spec, tmp_path, request):
    rlrun = load_rlrun(request.config.rootpath / "examples" / "quickstart.yaml")
    SweepState.open(tmp_path / "s", settings(rlrun, [8], ["sqrt"], 1, 4096, 1024), fresh=False)
    SweepState.open(tmp_path / "s", settings(rlrun, [8], ["sqrt"], 1, 4096, 1024, [0]), fresh=False)
    with pytest.raises(SweepError, match="--staleness"):
        SweepState.open(tmp_path / "s", settings(rlrun, [8], ["sqrt"], 1, 4096, 1024, [0, 1]), fresh=False)
