"""The step record: one line of metrics.jsonl per training step, written by the driver and read by
the report, /metrics, the live view, calibration, the re-planner and the sweep.

Its JSON keys are the field names (snake_case: a Python record); everything Kubernetes or a user's
YAML sees is camelCase (rlscale.progress_report). Reading is tolerant: keys this version does not
know are ignored and missing ones take their defaults, so a log written by another version still reads.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any


@dataclass
class ShownSample:
    """One generation of the step and its reward, as a person checks what the model says."""

    prompt: str = ""
    completion: str = ""
    answer: Any = None
    reward: float = 0.0
    finished: bool = False


@dataclass
class StepRecord:
    """What one step did and measured (metrics.jsonl); the loop fills the run-level fields at the end."""

    step: int = 0
    samples: int = 0  # run total after this step
    batch_samples: int = 0
    prompts: int = 0
    samples_per_prompt: int = 0
    lr: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # rlscale.metrics_names.PHASES
    step_seconds: float = 0.0
    samples_per_second: float = 0.0
    reward_mean: float = 0.0
    # Each term of the reward expression: its mean unweighted value over the step's scored samples
    # (trackers: reward/<term>), and the calls killed at task.rewardTimeout (reward/timeouts).
    reward_terms: dict[str, float] = field(default_factory=dict)
    reward_timeouts: int = 0
    generated_tokens: int = 0
    trained_tokens: int = 0
    generated_tokens_total: int = 0
    trained_tokens_total: int = 0
    weights_version: int = 0
    # Bounded staleness: how many versions older than the weights it trained the batch's generator was,
    # and the run's samples dropped so far as older than the plan's staleness (never trained on).
    staleness: int = 0
    stale_samples: int = 0
    # Multi-turn rollouts (rlscale.trainer.tools.loop.tool_metrics): turns and calls_per_trajectory (means),
    # calls, errors, seconds (in tools) and truncated (trajectories cut) over the step's trajectories; {} single-turn.
    tools: dict[str, float] = field(default_factory=dict)
    # Bytes of the weight update this step sent (spec.lora: the adapter's; 0 when nothing was published).
    sync_bytes: int = 0
    skipped: bool = False
    rollout_replicas: int = 1
    learner_replicas: int = 1
    # {"rollout": n, "learner": m}: the cores each side ran on when `rlscale run` split a cpu host's cores
    # to generate ahead (rlscale/cpu_split.py); None: every core, or pods and GPUs of their own.
    cores: dict[str, int] | None = None
    predicted_step_seconds: float | None = None
    loss: float | None = None
    # The gradient noise scale: the learner's EMA, and this step's raw estimates (averaged over many
    # steps by rlscale.plan.calibration, far steadier than any one step's).
    noise_scale: float | None = None
    noise_grad_sq: float | None = None
    noise_trace: float | None = None
    checkpoint_seconds: float | None = None
    # What a run that does not learn is read by first (rlscale.metrics_names.DIAGNOSTICS).
    mixed_group_fraction: float | None = None
    entropy: float | None = None
    clip_fraction: float | None = None
    grad_norm: float | None = None
    logprob_diff: float | None = None
    logprob_abs_diff: float | None = None
    # The learner's updates on the batch (spec.algorithm.epochs x miniBatches optimiser steps), and with
    # spec.algorithm.isCap the truncated importance weights: their token mean, and the share of tokens
    # whose weight hit the cap (docs/algorithms.md).
    optimizer_steps: int | None = None
    is_weight_mean: float | None = None
    is_truncated_fraction: float | None = None
    # What the loop adds on top of the model's own work: serving calls, publishing, DeepSpeed.
    engine_generate_seconds: float | None = None
    train_compute_seconds: float | None = None
    overhead_seconds: float | None = None
    sample: ShownSample | None = None
    # Held-out evals: on the steps that ran one, and the score before any update on the first step.
    eval: float | None = None
    eval_accuracy: float | None = None
    eval_reward: float | None = None
    eval_seconds: float | None = None
    eval_at_start: dict[str, float] | None = None
    # Run-level figures as of this step (RunLoop.finish_record).
    target_metric: float | None = None  # moving average of the evals
    wall_seconds: float = 0.0  # the run's clock: steps and evals over every segment
    time: float = 0.0  # unix time the step (and its eval) ended
    noise_scale_window: float | None = None  # averaged over a window; None while not significant
    samples_per_second_recent: float | None = None  # median of the last steps: one step swings +-50%
    eta_seconds: float | None = None
    time_to_target_seconds: float | None = None
    samples_to_target: int | None = None

    def diagnostic(self, key: str) -> float | None:
        """One of rlscale.metrics_names.DIAGNOSTIC_KEYS."""
        return getattr(self, key)

    def config(self) -> tuple[int, int, int, int]:
        """(prompts, samples per prompt, rollout replicas, learner replicas) the step ran with."""
        return self.prompts, self.samples_per_prompt, self.rollout_replicas, self.learner_replicas

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of metrics.jsonl; NaN and infinities become null."""
        return finite(asdict(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), allow_nan=False)

    def scalars(self) -> dict[str, float]:
        """The record's numbers under flat keys, as the trackers log them: each numeric field by its name,
        a dict's entries as <field>/<key> (phases/generate, eval_at_start/eval/accuracy), the reward's terms
        as reward/<term> and the timeouts as reward/timeouts; text, the sample and missing values left out."""
        out: dict[str, float] = {}
        for k, v in self.to_dict().items():
            prefix = FLAT_PREFIX.get(k, k)
            if isinstance(v, dict) and k != "sample":
                out.update({f"{prefix}/{kk}": float(vv) for kk, vv in v.items() if _number(vv)})
            elif _number(v):
                out[prefix] = float(v)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepRecord:
        kw = {k: v for k, v in d.items() if k in _FIELDS}
        if isinstance(kw.get("sample"), dict):
            kw["sample"] = ShownSample(**{k: v for k, v in kw["sample"].items() if k in _SAMPLE_FIELDS})
        return cls(**kw)


_FIELDS = frozenset(f.name for f in fields(StepRecord))
FLAT_PREFIX = {"reward_terms": "reward", "reward_timeouts": "reward/timeouts"}  # StepRecord.scalars' keys


def _number(v: Any) -> bool:
    return isinstance(v, (int, float))
_SAMPLE_FIELDS = frozenset(f.name for f in fields(ShownSample))


def finite(x: Any) -> Any:
    """x with every NaN or infinity replaced by None (JSON, and so the API server, has neither)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file; a line cut short by a crash ends the usable log."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return out


def read_records(path: Path) -> list[StepRecord]:
    """metrics.jsonl as step records (none when it is missing)."""
    return [StepRecord.from_dict(d) for d in read_jsonl(Path(path)) if isinstance(d, dict)]


def append_record(path: Path, rec: StepRecord) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(rec.to_json() + "\n")


def write_records(path: Path, recs: list[StepRecord]) -> None:
    """Replace the file atomically with these records (a reader never sees half of it)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(r.to_json() + "\n" for r in recs), encoding="utf-8")
    os.replace(tmp, path)
