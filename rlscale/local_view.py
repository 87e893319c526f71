"""What `rlscale run` shows while a run trains: the step records as the driver appends them, and the
live progress view of the newest one."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlscale.progress import fmt_diagnostics, fmt_duration, fmt_lr
from rlscale.records import StepRecord, read_records
from rlscale.roles import RunEnd

console = Console()


@dataclass
class JsonlTail:
    """Follows metrics.jsonl as the driver appends to it; a rewrite (resume) starts it over."""

    path: Path
    offset: int = 0
    inode: int | None = None

    def skip_existing(self) -> None:
        if self.path.exists():
            st = self.path.stat()
            self.offset, self.inode = st.st_size, st.st_ino

    def read(self) -> list[StepRecord]:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return []
        if st.st_ino != self.inode or st.st_size < self.offset:
            self.offset, self.inode = 0, st.st_ino  # replaced atomically on resume: read it anew
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1  # only whole lines; a half-written one waits
        self.offset += end
        out = []
        for line in chunk[:end].splitlines():
            try:
                out.append(StepRecord.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError, AttributeError):
                continue
        return out


def progress_view(rec: StepRecord | None, target: float, metric: str, budget_samples: int, bar: Progress) -> Group:
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold cyan")
    t.add_column()
    if rec is None:
        t.add_row("status", "starting roles (Ray head, rollout, learner)...")
        return Group(bar, t)
    split = "  ".join(f"{k} {v:.2f}s" for k, v in rec.phases.items())
    tm = rec.target_metric
    t.add_row("step", f"{rec.step}  (batch {rec.prompts}x{rec.samples_per_prompt}, lr {fmt_lr(rec.lr)})")
    t.add_row("samples", f"{rec.samples:,} of at most {budget_samples:,}")
    t.add_row("reward", f"{rec.reward_mean:.3f}")
    t.add_row(metric, f"{tm:.3f} / {target}" if tm is not None else f"- / {target}")
    t.add_row("samples/s", f"{rec.samples_per_second:.1f}")
    t.add_row("last step", f"{rec.step_seconds:.2f}s = {split}")
    t.add_row("diagnostics", "  ".join(f"{label} {value}" for label, value in fmt_diagnostics(rec)))
    if rec.time_to_target_seconds is not None:
        t.add_row("time to target", f"[bold green]{fmt_duration(rec.time_to_target_seconds)}[/]  "
                  f"({rec.samples_to_target:,} samples)")
    else:
        t.add_row("ETA to target", fmt_duration(rec.eta_seconds))
    return Group(bar, t)


def first_record(path: Path) -> StepRecord | None:
    """metrics.jsonl's first record (it carries the score before training), without reading the rest."""
    try:
        with open(path, encoding="utf-8") as f:
            return StepRecord.from_dict(json.loads(f.readline()))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


class TargetBar:
    """The bar from the run's score before training to its target: the builtin model starts at 0.724 of a
    0.8 target, so a bar from 0 stood at 90% before the first step."""

    def __init__(self, metric: str, target: float, out: Console, start: float | None = None):
        self.metric, self.target, self.start = metric, target, start
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                            TimeElapsedColumn(), console=out)
        self.task = self.bar.add_task(self._words(), total=self._span())

    def _span(self) -> float:
        return max(self.target - (self.start or 0.0), 1e-9)

    def _words(self) -> str:
        return f"{self.metric} {self.start:.3f} -> {self.target}" if self.start is not None else \
            f"{self.metric} -> {self.target}"

    def see(self, rec: StepRecord) -> None:
        """Take a step record: the start score when it carries one, the moving average when it has one."""
        # The record that carries it is the run's first step: it wins over a start read from an older log.
        if rec.eval_at_start and self.metric in rec.eval_at_start:
            self.start = float(rec.eval_at_start[self.metric])
            self.bar.update(self.task, total=self._span(), description=self._words())
        if rec.target_metric is not None:
            done = min(self._span(), max(0.0, rec.target_metric - (self.start or 0.0)))
            self.bar.update(self.task, completed=done)


def progress_line(rec: StepRecord, target: float, metric: str) -> str:
    """One eval as a line of a log (the view where the output is not a terminal)."""
    avg = f"{rec.target_metric:.3f}" if rec.target_metric is not None else "-"
    eta = (f"time to target {fmt_duration(rec.time_to_target_seconds)}" if rec.time_to_target_seconds is not None
           else f"ETA {fmt_duration(rec.eta_seconds)}")
    return (f"step {rec.step}  samples {rec.samples:,}  {metric} {rec.eval:.3f} (moving average {avg} of {target})  "
            f"{rec.samples_per_second:.1f} samples/s  {eta}")


class RunView:
    """What the run shows while it trains. On a terminal, the live view, redrawn in place; elsewhere (a pipe,
    a log, CI) one line per eval and the last view once at the end, each on lines of its own: rich's Live
    redraws nothing there and ends its last line only on a terminal, so what came next shared that line."""

    def __init__(self, out: Console, full: Callable[[StepRecord | None], RenderableType],
                 line: Callable[[StepRecord], str] | None = None):
        self.out, self.full, self.line = out, full, line
        self.live: Live | None = None
        self.last: StepRecord | None = None

    def __enter__(self) -> RunView:
        if self.out.is_terminal:
            self.live = Live(self.full(None), console=self.out, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def update(self, last: StepRecord | None, new: list[StepRecord]) -> None:
        self.last = last
        if self.live is not None:
            self.live.update(self.full(last))
            return
        for rec in new:
            if rec.eval is None:
                continue
            if self.line is not None:
                self.out.print(self.line(rec), highlight=False, markup=False, soft_wrap=True)  # one line in a log
            else:
                self.out.print(self.full(rec))

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)
        else:
            self.out.print(self.full(self.last))


def cli_name() -> str:
    """How the user started rlscale (`.venv/bin/rlscale` from `make run`), for commands to copy."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) != "rlscale":
        return "rlscale"
    try:
        rel = os.path.relpath(argv0)
    except ValueError:
        return argv0
    return rel if not rel.startswith("..") else argv0


def _shown(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def finished_end(run_dir: Path, spec: Any) -> tuple[RunEnd, StepRecord] | None:
    """(how it ended, the record that says so) when the run in run_dir has finished, as its driver would decide on
    a resume (the target, once reached, stays reached; the budget is the spec's now, so a raised budget goes on);
    None when there is nothing to finish or it still has steps to go. A report older than the records (a run
    killed before it wrote one) is not finished: its driver resumes."""
    metrics, summary = run_dir / "metrics.jsonl", run_dir / "summary.md"
    if not (metrics.exists() and summary.exists()) or summary.stat().st_mtime < metrics.stat().st_mtime:
        return None
    recs = read_records(metrics)
    if not recs:
        return None
    reached = next((r for r in recs if r.time_to_target_seconds is not None), None)
    if reached is not None:
        return RunEnd.TARGET, reached
    last = recs[-1]
    if last.step >= spec.budget.max_steps or last.samples >= spec.budget.max_samples:
        return RunEnd.BUDGET, last
    return None


def print_finished(end: RunEnd, rec: StepRecord, run_dir: Path, source: Path | None, name: str) -> None:
    """A second `rlscale run` of a finished run: what it reached and how to train again, instead of a minute of
    start-up that ends where it began."""
    how = (f"target reached at step {rec.step} ({rec.samples_to_target or rec.samples:,} samples, "
           f"{fmt_duration(rec.time_to_target_seconds)})" if end == RunEnd.TARGET
           else f"budget spent at step {rec.step} ({rec.samples:,} samples)")
    console.print(f"[bold]RLRun {name} has already finished[/]: {how}. Report: {_shown(run_dir / 'summary.md')}",
                  highlight=False, soft_wrap=True)
    spec_file = _shown(source) if source else "FILE"
    console.print(f"To train again from the start: {cli_name()} run {spec_file} --fresh (deletes "
                  f"{_shown(run_dir)}), or --runs-dir DIR to keep it; to train further, raise spec.budget "
                  f"or spec.target.value in a copy under another metadata.name.", highlight=False, markup=False,
                  soft_wrap=True)


def next_commands(run_dir: Path, source: Path | None, code: int, exported: bool) -> list[tuple[str, str]]:
    """(command, what it does) to offer when a run ends."""
    cli, spec_file, where = cli_name(), _shown(source) if source else "FILE", _shown(run_dir)
    out = [(f"open {where}/curves.png {where}/summary.md", "the learning curves and the report")]
    if code == RunEnd.INTERRUPTED:
        return [(f"{cli} run {spec_file}", "resume from the last checkpoint"), *out]
    if not exported:
        out.append((f"{cli} export {where} --hf {where}/export/hf", "the trained model as a Hugging Face directory"))
    out += [(f"{cli} run {spec_file} --fresh", "train again from the start (another --seed: the spread)"),
            (f"{cli} plan {spec_file}", "the plan and the candidates it compared"),
            (f"{cli} sweep {spec_file}", "the batch-size study that checks the planner"),
            ("docs/operations.md", "the same RLRun on Kubernetes: helm install, kubectl apply")]
    return out


def print_start(cfg: Any, plan: Any, run_dir: Path, port_note: str = "") -> None:
    from rlscale.cpu_split import CoreSplit

    console.print(f"plan: {plan.summary()}  [dim]({plan.reason})[/]", highlight=False, soft_wrap=True)
    if cfg.local and cfg.local.learner_cpus:
        p = plan.predicted
        split = CoreSplit(cfg.local.rollout_cpus or [], cfg.local.learner_cpus)
        console.print(split.describe(p.generate + p.reward, p.train), highlight=False)
    console.print(f"metrics: http://127.0.0.1:{cfg.metrics_port}/metrics{port_note}   report: {run_dir}",
                  highlight=False)


def print_end(code: int, run_dir: Path, spec: Any, source: Path | None = None, exported_words: str = "") -> None:
    """How the run ended, its summary.md as written (no rich markup: `![curves](curves.png)` and any
    `[...]` stay), and the commands to run next."""
    summary = run_dir / "summary.md"
    if code == RunEnd.TARGET:
        console.print(f"[bold green]target reached[/] — report: {summary}{exported_words}", highlight=False)
    elif code == RunEnd.BUDGET:
        console.print(f"[yellow]budget spent before the target[/] — report: {summary}{exported_words}",
                      highlight=False)
    elif code == RunEnd.INTERRUPTED:
        console.print(f"[yellow]stopped; checkpoint kept[/] — run the same command again to resume. Report: {summary}",
                      highlight=False)
    else:
        console.print(f"[red]the driver failed (exit {code})[/]; see {run_dir / 'logs'}", highlight=False)
        return
    if summary.exists() and code in (RunEnd.TARGET, RunEnd.BUDGET):
        console.print(summary.read_text(encoding="utf-8"), highlight=False, markup=False, soft_wrap=True)
    console.print("[bold]next:[/]", highlight=False)
    rows = next_commands(run_dir, source, code, bool(spec.export.hf))
    width = max(len(c) for c, _ in rows)
    for cmd, what in rows:
        console.print(f"  {cmd.ljust(width)}  # {what}", highlight=False, markup=False, soft_wrap=True)
