"""The sweep's figures: curves.png, throughput.png, decision.png, and staleness.png when runs went ahead
(matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

from rlscale.plan.calibration import median_present
from rlscale.sweep.analysis import _mean_curve
from rlscale.sweep.report import SweepResult


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, out: Path, axes=(), legend_loc: str = "best") -> Path:
    """Grid and legend on each axis, then write the PNG and free the figure."""
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc=legend_loc)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_curves(res: SweepResult, out: Path) -> Path:
    """Metric vs samples, one line per batch (seed mean of the moving average), one panel per lr rule."""
    plt = _plt()
    rules = sorted(res.by_rule())
    fig, axes = plt.subplots(1, len(rules), figsize=(6.5 * len(rules), 4.8), squeeze=False, sharey=True)
    spec = res.spec
    for ax, rule in zip(axes[0], rules, strict=True):
        for i, c in enumerate(sorted(res.by_rule()[rule], key=lambda c: c.prompts)):
            color = f"C{i}"
            for r in c.runs:
                pts = r.evals()
                ax.plot([p.samples for p in pts], [p.value for p in pts], ".", color=color, ms=2, alpha=0.35)
            mc = _mean_curve(c.runs)
            if mc:
                ax.plot([s for s, _ in mc], [v for _, v in mc], "-", color=color, lw=1.8,
                        label=f"{c.prompts}x{spec.batch.samples_per_prompt} lr {c.lr:.2g}")
        if res.level is not None:
            ax.axhline(res.level, color="k", ls=":", lw=1, label=f"measured level {res.level:.2f}")
        ax.axhline(spec.target.value, color="k", ls="--", lw=1, label=f"target {spec.target.value}")
        ax.set_title(f"lr rule {rule}")
        ax.set_xlabel("samples")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    axes[0][0].set_ylabel(f"{spec.target.metric} (moving average of {spec.target.window}; dots: each eval)")
    return _save(plt, fig, out)


def plot_throughput(res: SweepResult, out: Path) -> Path:
    """Samples/s vs batch: each run, the median per batch, and the planner's predictions."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    runs = [(r.batch, r.throughput()) for r in res.runs if r.throughput()]
    ax.plot([b for b, _ in runs], [x for _, x in runs], "o", color="C0", alpha=0.35, ms=4, label="measured (each run)")
    per: dict[int, list] = {}
    for c in res.cells:
        per.setdefault(c.batch, []).append(c)
    bs = sorted(per)

    def line(attr: str):
        meds = {b: median_present(getattr(c, attr) or None for c in per[b]) for b in bs}
        return [b for b in bs if meds[b] is not None], [meds[b] for b in bs if meds[b] is not None]

    for attr, style, label in (("throughput", "o-", "measured (median)"),
                               ("predicted_throughput", "s--", "planner, uncalibrated"),
                               ("predicted_throughput_cal", "^--", f"planner, calibrated at {res.ref_prompts} prompts"),
                               ("predicted_throughput_fit", "d:", "planner, fitted to every batch")):
        x, y = line(attr)
        if x:
            ax.plot(x, y, style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch N (samples per step)")
    ax.set_ylabel("samples/s (step clock)")
    ax.set_title("throughput vs batch")
    return _save(plt, fig, out, [ax])


def plot_decision(res: SweepResult, out: Path) -> Path:
    """Throughput gain vs samples penalty against the reference batch; above the diagonal a batch is faster."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    pts = []
    for i, (rule, cells) in enumerate(sorted(res.by_rule().items())):
        base = next((c for c in cells if c.prompts == res.ref_prompts), None)
        if base is None or not base.throughput or not base.e_mean:
            continue
        for c in cells:
            if not (c.throughput and c.e_mean):
                continue
            pen, gain = c.e_mean / base.e_mean, c.throughput / base.throughput
            pts += [pen, gain]
            ax.plot(pen, gain, "o", color=f"C{i}", label=f"measured, rule {rule}" if c is cells[0] else None)
            ax.annotate(f"{c.prompts}", (pen, gain), textcoords="offset points", xytext=(5, 4), fontsize=8)
            if c.predicted_penalty and c.predicted_throughput and base.predicted_throughput:
                ppen, pgain = c.predicted_penalty, c.predicted_throughput / base.predicted_throughput
                pts += [ppen, pgain]
                ax.plot(ppen, pgain, "x", color=f"C{i}", label=f"planner, rule {rule}" if c is cells[0] else None)
    lo, hi = (min(pts + [1.0]) * 0.8, max(pts + [1.0]) * 1.25) if pts else (0.5, 2.0)
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="break-even: gain = penalty")
    ax.fill_between([lo, hi], [lo, hi], [hi, hi], color="g", alpha=0.06)
    ax.text(lo * 1.05, hi * 0.9, "faster than the reference", fontsize=8, color="g")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"samples penalty E(N)/E(N_ref) at level {res.level}")
    ax.set_ylabel("throughput gain X(N)/X(N_ref)")
    ax.set_title(f"decision rule (reference {res.ref_prompts} prompts; labels: prompts)")
    return _save(plt, fig, out, [ax], "lower right")


def plot_staleness(res: SweepResult, out: Path) -> Path | None:
    """Left: the metric vs samples at each staleness (seed mean of the moving average, the decision rule,
    each batch). Right: throughput gain vs samples penalty against staleness 0 with their 95% intervals,
    the planner's gain beside it; above the diagonal running ahead is faster."""
    fit = res.staleness
    if fit is None:  # no batch ran both ahead and at staleness 0
        return None
    plt = _plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    rule, spp = res.decision_rule, res.spec.batch.samples_per_prompt
    runs = [r for r in res.runs + res.stale_runs if r.rule == rule]
    for i, (prompts, k) in enumerate(sorted({(r.prompts, r.staleness) for r in runs})):
        mc = _mean_curve([r for r in runs if (r.prompts, r.staleness) == (prompts, k)])
        if mc:
            left.plot([s for s, _ in mc], [v for _, v in mc], "-", color=f"C{i}", lw=1.8,
                      label=f"{prompts}x{spp}, staleness {k}")
    if res.level is not None:
        left.axhline(res.level, color="k", ls=":", lw=1, label=f"measured level {res.level:.2f}")
    left.set_xlabel("samples")
    left.set_ylabel(f"{res.spec.target.metric} (moving average, mean over seeds)")
    left.set_title(f"learning curves by staleness (rule {rule})")
    pts = [1.0]
    for row in fit.rows:
        if row.penalty is None or row.gain is None:
            continue
        xerr = [[row.penalty - row.penalty_ci[0]], [row.penalty_ci[1] - row.penalty]] if row.penalty_ci else None
        yerr = [[row.gain - row.gain_ci[0]], [row.gain_ci[1] - row.gain]] if row.gain_ci else None
        right.errorbar(row.penalty, row.gain, xerr=xerr, yerr=yerr, fmt="o", color=f"C{row.staleness}", capsize=3,
                       label=f"{row.prompts}x{spp} at staleness {row.staleness}, measured")
        pts += [v for ci in (row.penalty_ci, row.gain_ci) if ci for v in ci] + [row.penalty, row.gain]
        if row.predicted_gain:
            right.plot(row.penalty, row.predicted_gain, "x", color=f"C{row.staleness}", ms=8,
                       label=f"planner's gain at staleness {row.staleness}")
            pts.append(row.predicted_gain)
    lo, hi = min(pts) * 0.95, max(pts) * 1.05
    right.plot([lo, hi], [lo, hi], "k--", lw=1, label="break-even: gain = penalty")
    right.fill_between([lo, hi], [lo, hi], [hi, hi], color="g", alpha=0.06)
    right.set_xlim(lo, hi)
    right.set_ylim(lo, hi)
    right.set_xlabel("samples penalty E_K / E_0 (95% interval over seeds)")
    right.set_ylabel("throughput gain X_K / X_0")
    p = f"p = {fit.p:.3f} per step" if fit.p is not None else "p not fitted"
    right.set_title(f"running ahead vs the synchronous loop ({p})")
    return _save(plt, fig, out, [left, right], "lower right")


def write_plots(res: SweepResult, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    made = [plot_curves(res, out_dir / "curves.png"), plot_throughput(res, out_dir / "throughput.png"),
            plot_decision(res, out_dir / "decision.png"), plot_staleness(res, out_dir / "staleness.png")]
    return [p for p in made if p is not None]
