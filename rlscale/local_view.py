"""What `rlscale run` shows while a run trains: the step records as the driver appends them, and the
live progress view of the newest one."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rich.console import Group
from rich.progress import Progress
from rich.table import Table

from rlscale.progress import fmt_diagnostics, fmt_duration, fmt_lr
from rlscale.records import StepRecord


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
