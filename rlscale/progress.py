"""Target tracking for a run (moving average of evals, time- and samples-to-target, ETA), and how
its durations, learning rates and step diagnostics are shown to a person."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rlscale.records import StepRecord


@dataclass
class TargetTracker:
    """Decides "target reached" on a moving average, since one eval of 500 prompts moves by about 0.05."""

    target: float
    window: int = 3
    higher_is_better: bool = True
    evals: deque = field(default_factory=deque)  # (samples, value)
    history: list = field(default_factory=list)  # (samples, elapsed_s, moving average)
    reached_at: dict | None = None  # {"step", "samples", "seconds"} when first reached

    def add(self, step: int, samples: int, elapsed_s: float, value: float) -> float:
        """Record one eval; returns the moving average over the last `window` evals."""
        self.evals.append((samples, value))
        while len(self.evals) > self.window:
            self.evals.popleft()
        avg = sum(v for _, v in self.evals) / len(self.evals)
        self.history.append((samples, elapsed_s, avg))
        ok = avg >= self.target if self.higher_is_better else avg <= self.target
        if ok and len(self.evals) == self.window and self.reached_at is None:
            self.reached_at = {"step": step, "samples": samples, "seconds": elapsed_s}
        return avg

    @property
    def current(self) -> float | None:
        return self.history[-1][2] if self.history else None

    @property
    def reached(self) -> bool:
        return self.reached_at is not None

    def eta_seconds(self, samples_per_second: float, lookback: int = 6) -> float | None:
        """Seconds left at the current rate of progress per sample (None when not improving)."""
        if self.reached:
            return 0.0
        if len(self.history) < 2 or samples_per_second <= 0:
            return None
        pts = self.history[-lookback:]
        (s0, _, v0), (s1, _, v1) = pts[0], pts[-1]
        if s1 <= s0:
            return None
        slope = (v1 - v0) / (s1 - s0)  # metric per sample
        gap = self.target - v1
        if (slope <= 0 and self.higher_is_better) or (slope >= 0 and not self.higher_is_better):
            return None
        return max(0.0, gap / slope) / samples_per_second

    def state_dict(self) -> dict:
        return {"evals": list(self.evals), "history": list(self.history), "reached_at": self.reached_at}

    def load_state_dict(self, state: dict) -> None:
        self.evals = deque(tuple(x) for x in state.get("evals", []))
        self.history = [tuple(x) for x in state.get("history", [])]
        self.reached_at = state.get("reached_at")


def fmt_duration(seconds: float | None) -> str:
    """A duration as a person reads it: 0.73s, 45s, 4m12s, 3h05m; None is "-"."""
    if seconds is None:
        return "-"
    x = max(0.0, float(seconds))
    if x < 10:
        return f"{x:.2f}s"  # a step time: its hundredths matter
    s = int(round(x))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def fmt_lr(lr: float) -> str:
    """A learning rate, one way everywhere (plan table, plan summary, progress): 1.41e-04."""
    return f"{lr:.2e}"


# Step diagnostics as a person reads them: (metrics.jsonl key, label, format); one list for the
# live view and the report.
DIAGNOSTIC_FORMATS = (
    ("mixed_group_fraction", "mixed groups", "{:.0%}"),
    ("entropy", "entropy", "{:.3f}"),
    ("clip_fraction", "clipped", "{:.1%}"),
    ("grad_norm", "grad norm", "{:.3g}"),
    ("logprob_diff", "logp rollout-learner", "{:+.2e}"),
    ("logprob_abs_diff", "abs logp diff", "{:.2e}"),
)


def fmt_diagnostics(rec: StepRecord) -> list[tuple[str, str]]:
    """(label, value) per diagnostic of a step record; "-" where the step has none (skipped, not measured)."""
    out = []
    for key, label, fmt in DIAGNOSTIC_FORMATS:
        v = rec.diagnostic(key)
        out.append((label, fmt.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"))
    return out
