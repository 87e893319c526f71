"""The run report in runs/<name>/: curves.png, diagnostics.png and summary.md, from metrics.jsonl and plan.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlscale.metrics_names import PHASES
from rlscale.plan.calibration import median_present
from rlscale.progress import DIAGNOSTIC_FORMATS
from rlscale.progress_report import export_words
from rlscale.records import StepRecord, read_records

# spec.export.hf: what the run's end exported (ProgressReport.export's object), beside summary.md.
EXPORT_NOTE = "export.json"


def read_export_note(run_dir: str | Path) -> dict[str, Any] | None:
    """The report directory's export.json, or None (none, or unreadable)."""
    try:
        note = json.loads((Path(run_dir) / EXPORT_NOTE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return note if isinstance(note, dict) else None


def export_suffix(run_dir: str | Path) -> str:
    """What a console line adds when the report directory has an export note (" — exported to ..."), else
    the empty string."""
    words = export_words(read_export_note(run_dir))
    return f" — {words}" if words else ""


def read_plans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    data = json.loads(path.read_text(encoding="utf-8"))
    return data.get("plans", []) if isinstance(data, dict) else data


def plot_curves(records: list[StepRecord], target: float, metric: str, out: Path) -> Path | None:
    """Target metric and reward vs samples and vs wall time; phase seconds per step."""
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evals = [r for r in records if r.eval is not None]
    start = records[0].eval_at_start
    if start and metric in start:  # the score before any update, at 0 samples and 0 s
        evals = [StepRecord(eval=start[metric]), *evals]
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    for a, key, label in ((ax[0][0], "samples", "samples"), (ax[0][1], "wall_seconds", "wall time (s)")):
        if evals:
            a.plot([getattr(r, key) for r in evals], [r.eval for r in evals], "o", ms=3, alpha=0.5,
                   label=f"{metric} (each eval)")
            ma = [r for r in evals if r.target_metric is not None]
            a.plot([getattr(r, key) for r in ma], [r.target_metric for r in ma], "-", lw=2,
                   label=f"{metric} (moving average)")
        a.plot([getattr(r, key) for r in records], [r.reward_mean for r in records], "-", lw=0.8, alpha=0.6,
               label="reward (train batch)")
        a.axhline(target, color="k", ls="--", lw=1, label=f"target {target}")
        a.set_xlabel(label)
        a.set_ylim(0, 1.05 if target <= 1 else None)
        a.grid(alpha=0.3)
        a.legend(fontsize=8, loc="lower right")
    ax[0][0].set_title(f"{metric} vs samples")
    ax[0][1].set_title(f"{metric} vs wall time")
    steps = [r.step for r in records]
    bottom = [0.0] * len(records)
    a = ax[1][0]
    for phase in PHASES:
        vals = [r.phases.get(phase, 0.0) for r in records]
        a.bar(steps, vals, bottom=bottom, width=1.0, label=phase)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    pred = [r.predicted_step_seconds for r in records]
    if any(p is not None for p in pred):
        a.plot(steps, [p if p is not None else float("nan") for p in pred], "k-", lw=1, label="planned step")
    a.set_xlabel("step")
    a.set_ylabel("seconds")
    a.set_title("phase seconds per step")
    a.legend(fontsize=8)
    a = ax[1][1]
    a.plot(steps, [r.samples_per_second for r in records], lw=1, label="samples/s")
    a.set_xlabel("step")
    a.set_title("throughput")
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def completion_tokens(rec: StepRecord) -> float | None:
    """The step's mean completion length in tokens (generated tokens over its samples)."""
    return rec.generated_tokens / rec.batch_samples if rec.batch_samples else None


def plot_diagnostics(records: list[StepRecord], out: Path) -> Path | None:
    """One panel per step diagnostic (rlscale.progress.DIAGNOSTIC_FORMATS) against the step, and the mean
    completion length (a policy that learns to stop early, or runs into task.maxNewTokens, shows there)."""
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(key, label, lambda r, key=key: r.diagnostic(key)) for key, label, _ in DIAGNOSTIC_FORMATS]
    panels.append(("completion_tokens", "completion tokens (mean)", completion_tokens))
    if any(r.tools for r in records):  # multi-turn (StepRecord.tools)
        panels += [(f"tools/{k}", label, lambda r, k=k: r.tools.get(k)) for k, label in TOOL_PANELS]
    cols = 3
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for a, (key, label, value) in zip((a for row in axes for a in row), panels, strict=False):
        pts = [(r.step, value(r)) for r in records if _num(value(r)) is not None]
        if pts:
            a.plot([x for x, _ in pts], [y for _, y in pts], "-", lw=1)
        else:
            a.text(0.5, 0.5, "not measured", ha="center", va="center", transform=a.transAxes)
        if key in ("logprob_diff",):
            a.axhline(0.0, color="k", lw=0.5)
        a.set_title(label)
        a.set_xlabel("step")
        a.grid(alpha=0.3)
    for a in [a for row in axes for a in row][len(panels):]:
        a.axis("off")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


TOOL_PANELS = (("calls_per_trajectory", "tool calls per trajectory"), ("turns", "turns per trajectory"),
               ("errors", "tool errors per step"), ("truncated", "trajectories cut per step"))


def tool_lines(records: list[StepRecord]) -> list[str]:
    """Multi-turn runs: tool calls per trajectory over the first and the last quarter of the steps, and the
    run's tool errors, seconds in tools and trajectories cut."""
    steps = [r for r in records if r.tools]
    if not steps:
        return []
    quarter = max(1, len(steps) // 4)
    first, last = (median_present([r.tools.get("calls_per_trajectory") for r in part])
                   for part in (steps[:quarter], steps[-quarter:]))
    total = {k: sum(r.tools.get(k, 0.0) for r in steps) for k in ("calls", "errors", "seconds", "truncated")}
    return [f"- tool calls per trajectory: {first:.2f} over the first {quarter} steps, {last:.2f} over the last "
            f"{quarter} (median of the step means); {total['calls']:.0f} calls, {total['errors']:.0f} failed, "
            f"{total['seconds']:.1f} s in tools, {total['truncated']:.0f} trajectories cut"]


def diagnostics_table(records: list[StepRecord]) -> list[str]:
    """Markdown rows: each diagnostic's median over the first and the last quarter of the steps, and its last value."""
    n = len(records)
    quarter = max(1, n // 4)
    head, tail = records[:quarter], records[-quarter:]
    lines = [f"| diagnostic | median, first {quarter} steps | median, last {quarter} steps | last |",
             "|---|---:|---:|---:|"]
    for key, label, fmt in DIAGNOSTIC_FORMATS:
        def show(v: float | None, fmt: str = fmt) -> str:
            return fmt.format(v) if v is not None else "-"
        first, last = (median_present(_num(r.diagnostic(key)) for r in part) for part in (head, tail))
        latest = next((_num(r.diagnostic(key)) for r in reversed(records) if _num(r.diagnostic(key)) is not None),
                      None)
        lines.append(f"| {label} | {show(first)} | {show(last)} | {show(latest)} |")
    return lines


def reward_term_lines(records: list[StepRecord]) -> list[str]:
    """Each term of the reward on its own (mean unweighted value over the first and the last quarter of
    the steps), and the reward calls killed at task.rewardTimeout."""
    quarter = max(1, len(records) // 4)
    names = list(dict.fromkeys(k for r in records for k in r.reward_terms))
    lines = []
    for name in names:
        first, last = (median_present([r.reward_terms.get(name) for r in part])
                       for part in (records[:quarter], records[-quarter:]))
        if first is not None and last is not None:
            lines.append(f"- reward term {name}: {first:.3f} over the first {quarter} steps, {last:.3f} over the "
                         f"last {quarter} (median of the step means, unweighted)")
    timeouts = sum(r.reward_timeouts for r in records)
    if timeouts:
        lines.append(f"- reward calls killed at task.rewardTimeout: {timeouts} (scored task.rewardTimeoutScore)")
    return lines


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def start_vs_measured(plan: dict[str, Any] | None, reached: StepRecord | None, step_s: float | None,
                      sps: float | None) -> list[str]:
    """Markdown rows: what the plan made before the first step predicted (step time, throughput, samples- and
    time-to-target) beside what the run measured, with measured/planned."""
    from rlscale.plan.headline import known_samples_to_target, known_time_to_target

    pred = (plan or {}).get("predicted") or {}
    # A placeholder's samples- and time-to-target were never a prediction (rlscale/plan/headline.py): no ratio.
    rows = [("step time (s)", pred.get("stepSeconds"), step_s, "{:.3f}"),
            ("throughput (samples/s)", pred.get("samplesPerSecond"), sps, "{:.1f}"),
            ("samples to target", known_samples_to_target(plan), reached.samples_to_target if reached else None,
             "{:,.0f}"),
            ("time to target (s)", known_time_to_target(plan),
             reached.time_to_target_seconds if reached else None, "{:.0f}")]
    if not any(_num(p) for _, p, _, _ in rows):
        return []
    unknown = "not predicted (a placeholder)" if pred.get("samplesToTarget") is not None else "-"
    how = "calibrated" if (plan or {}).get("calibrated") else "uncalibrated: the accelerator profile's"
    out = ["", f"## The plan at start vs measured ({how} prediction)", "",
           "| | planned at start | measured | measured/planned |", "|---|---:|---:|---:|"]
    for label, p, m, fmt in rows:
        p, m = _num(p), _num(m)
        ratio = f"{m / p:.2f}" if p and m is not None else "-"
        shown = fmt.format(p) if p else (unknown if "target" in label else "-")
        out.append(f"| {label} | {shown} | {fmt.format(m) if m is not None else '-'} | "
                   f"{ratio} |")
    return out


def summarize(records: list[StepRecord], plans: list[dict[str, Any]], target: float, metric: str, name: str,
              export: dict[str, Any] | None = None) -> str:
    """summary.md: time- and samples-to-target, throughput, the plan's predicted vs measured step time, and
    the Hugging Face export (spec.export.hf) when the run's end wrote one (`export`: its note)."""
    lines = [f"# RLRun {name}", ""]
    if not records:
        return "\n".join(lines + ["No steps were recorded."])
    lines += ["![curves](curves.png)", ""]  # the curves first: what a reader opens the report for
    last = records[-1]
    reached = next((r for r in records if r.time_to_target_seconds is not None), None)
    if reached:
        lines.append(f"- **time to target**: {reached.time_to_target_seconds:.1f} s "
                     f"({metric} moving average >= {target})")
        lines.append(f"- **samples to target**: {reached.samples_to_target:,} (step {reached.step})")
    else:
        best = max((r.target_metric or 0.0) for r in records)
        lines.append(f"- target {metric} >= {target} **not reached**; best moving average {best:.3f}")
    lines.append(f"- steps: {last.step}, samples: {last.samples:,}, wall time: {last.wall_seconds:.1f} s")
    exported = export_words(export)
    if exported:
        lines.append(f"- model: {exported}" + ("" if export and export.get("error") else
                                               " (a Hugging Face directory: transformers and vLLM load it)"))
    start = records[0].eval_at_start or {}
    evals = [r for r in records if r.eval is not None]
    if metric in start and evals:
        lines.append(f"- held-out {metric}: {start[metric]:.3f} before training, "
                     f"{evals[-1].eval:.3f} at the last eval "
                     f"(step {evals[-1].step}), best {max(r.eval for r in evals):.3f}")
    lines += reward_term_lines(records)
    lines += tool_lines(records)
    quarter = max(1, len(records) // 4)
    lengths = [median_present([completion_tokens(r) for r in part]) for part in (records[:quarter], records[-quarter:])]
    if None not in lengths:
        lines.append(f"- completion length: {lengths[0]:.1f} tokens over the first {quarter} steps, {lengths[1]:.1f} "
                     f"over the last {quarter} (median of the step means)")
    tail = records[len(records) // 2:] or records  # skip the warm-up half when summarising speed
    sps = median_present([r.samples_per_second for r in tail])
    step_s = median_present([r.step_seconds for r in tail])
    pred = median_present([r.predicted_step_seconds for r in tail])
    if sps:
        lines.append(f"- measured throughput: {sps:.1f} samples/s (median over the second half)")
    if step_s:
        # Each step's prediction comes from the model as calibrated on the steps before it: close by
        # construction. The plan made before the first step is the honest comparison (start_vs_measured).
        ratio = f" (each step's prediction, recalibrated as the run measures: measured/predicted = " \
            f"{step_s / pred:.2f})" if pred else ""
        lines.append(f"- step time: measured {step_s:.3f} s, planned {pred:.3f} s{ratio}" if pred
                     else f"- step time: measured {step_s:.3f} s")
    phases = {p: median_present([r.phases.get(p) for r in tail]) for p in PHASES}
    if any(phases.values()):
        total = sum(v for v in phases.values() if v) or 1.0
        lines += ["", "| phase | median seconds | share |", "|---|---:|---:|"]
        for p, v in phases.items():
            if v is not None:
                lines.append(f"| {p} | {v:.4f} | {100 * v / total:.0f}% |")
    lines += start_vs_measured(plans[0] if plans else None, reached, step_s, sps)
    over = median_present([r.overhead_seconds for r in tail])
    if over is not None and step_s:
        lines.append("\nLoop overhead (step time not spent in generation or training compute): "
                     f"{over:.3f} s per step, {100 * over / step_s:.0f}% of the step.")
    lines += ["", "## Diagnostics", "",
              "Mixed groups: share of prompt groups whose rewards differ (GRPO learns only from those). "
              "Entropy: the learner's mean token entropy on the sampled responses, in nats. Clipped: share of "
              "tokens whose learner/rollout probability ratio lies outside the clip range. Grad norm: before "
              "clipping. logp rollout-learner: the two engines' log-prob difference on the same tokens before "
              "the update, mean per token, and its absolute value.", "", *diagnostics_table(records),
              "", "![diagnostics](diagnostics.png)"]
    if plans:
        lines += ["", "## Plans", ""]
        for p in plans:
            at = p.get("atStep", 0)
            lines.append(f"- step {at}: {p.get('prompts')}x{p.get('samplesPerPrompt')}, "
                         f"lr {p.get('learningRate', 0):.3g}, rollout {p.get('rolloutReplicas')}, "
                         f"learner {p.get('learnerReplicas')} — {p.get('reason', '')}"
                         + (f" (re-planned: {p['why']})" if p.get("why") and p["why"] != p.get("reason") else ""))
    lines.append("")
    return "\n".join(lines)


def write_report(run_dir: str | Path, target: float, metric: str, name: str) -> Path:
    """Write curves.png, diagnostics.png and summary.md into run_dir; returns the summary path."""
    d = Path(run_dir)
    records = read_records(d / "metrics.jsonl")
    plans = read_plans(d / "plan.json")
    plot_curves(records, target, metric, d / "curves.png")
    plot_diagnostics(records, d / "diagnostics.png")
    out = d / "summary.md"
    out.write_text(summarize(records, plans, target, metric, name, read_export_note(d)), encoding="utf-8")
    return out
