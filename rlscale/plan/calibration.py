"""Calibration: measured step phases and gradient noise scale, fed back into the planner."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from rlscale.metrics_names import PHASES
from rlscale.records import StepRecord

__all__ = ["CAMEL_FIELDS", "PHASES", "Calibration", "cores_of", "noise_from_steps"]


# Calibration's figures in camelCase (to_dict, a sweep's patch), phase seconds aside under "phases".
CAMEL_FIELDS = {"prompts": "prompts", "samplesPerPrompt": "samples_per_prompt", "rolloutReplicas": "rollout_replicas",
                "learnerReplicas": "learner_replicas", "promptTokens": "prompt_tokens",
                "responseTokens": "response_tokens", "tokensPerSample": "tokens_per_sample",
                "noiseScale": "noise_scale", "evalSeconds": "eval_s", "steps": "steps",
                "stalenessPenalty": "staleness_penalty", "turns": "turns", "toolSeconds": "tool_seconds"}


@dataclass(frozen=True)
class Calibration:
    """Phase seconds measured at a known configuration, and a measured noise scale (B_simple, samples)."""

    prompts: int | None = None
    samples_per_prompt: int | None = None
    rollout_replicas: int = 1
    learner_replicas: int = 1
    generate_s: float | None = None
    reward_s: float | None = None
    train_s: float | None = None
    sync_s: float | None = None
    prompt_tokens: float | None = None  # measured mean prompt length
    response_tokens: float | None = None  # measured mean response length
    tokens_per_sample: float | None = None  # generated tokens per sample (what the driver counts): the response
    noise_scale: float | None = None
    eval_s: float | None = None  # seconds of one held-out eval at rollout_replicas
    steps: int = 0  # how many step records went into it
    # p of the samples penalty (1 + p)^K of staleness K, fitted by `rlscale sweep --staleness` (>= 0);
    # None: the planner's default (rlscale.plan.staleness.DEFAULT_STALENESS_PENALTY).
    staleness_penalty: float | None = None
    # (rollout, learner) cores the phases ran on, when `rlscale run` split a cpu host's cores to generate
    # ahead; None: every core (calibrate() puts split phases back on every core).
    cores: tuple[int, int] | None = None
    # Multi-turn runs: model turns per trajectory and wall seconds in tools per step (StepRecord.tools).
    turns: float | None = None
    tool_seconds: float | None = None

    @property
    def has_phases(self) -> bool:
        return self.prompts is not None and self.samples_per_prompt is not None and any(
            _ok(getattr(self, f"{p}_s")) for p in PHASES)

    @property
    def has_noise_scale(self) -> bool:
        return _ok(self.noise_scale)

    @property
    def calibrated(self) -> bool:
        return self.has_phases or self.has_noise_scale

    @property
    def has_staleness_penalty(self) -> bool:
        v = self.staleness_penalty
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0

    def measured(self, phase: str) -> float | None:
        v = getattr(self, f"{phase}_s")
        return float(v) if _ok(v) else None

    def response_length(self) -> float | None:
        """Mean generated tokens per sample, if measured (response_tokens, else tokens_per_sample)."""
        for v in (self.response_tokens, self.tokens_per_sample):
            if _ok(v):
                return float(v)
        return None

    def to_dict(self) -> dict[str, Any]:
        """camelCase, JSON-able, measured figures only: the progress report carries it, status.calibration
        and a sweep's calibration patch keep it."""
        out: dict[str, Any] = {key: getattr(self, attr) for key, attr in CAMEL_FIELDS.items()
                               if getattr(self, attr) is not None}
        phases = {p: self.measured(p) for p in PHASES if self.measured(p) is not None}
        if phases:
            out["phases"] = phases
        if self.cores:
            out["cores"] = {"rollout": self.cores[0], "learner": self.cores[1]}
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Calibration | None:
        """From to_dict's form; None when nothing in it was measured."""
        d = d or {}
        kw = {attr: d[key] for key, attr in CAMEL_FIELDS.items() if d.get(key) is not None}
        kw.update({f"{p}_s": float(v) for p, v in (d.get("phases") or {}).items() if p in PHASES and _ok(v)})
        kw["cores"] = cores_of(d.get("cores"))
        cal = cls(**kw)
        return cal if cal.calibrated or cal.has_staleness_penalty else None

    @classmethod
    def from_steps(cls, records: Sequence[StepRecord], last: int = 10,
                   noise_last: int | None = None) -> Calibration:
        """Median over the last `last` step records that ran the latest configuration (robust to slow outliers).

        The noise scale comes from the last `noise_last` records (default `last`) of any
        configuration: see noise_from_steps.
        """
        recs = list(records)
        if not recs:
            return cls()
        key = recs[-1].config()
        same = [r for r in recs if r.config() == key][-last:]
        phases = {p: median_present(_get(r.phases, p) for r in same) for p in PHASES}
        window = noise_last or last
        # An eval runs on the rollout replicas only: any batch at the same replica count will do.
        evals = [r for r in recs if r.rollout_replicas == key[2]]
        prompts, spp, rollout, learner = key
        return cls(
            prompts=prompts or None, samples_per_prompt=spp or None, rollout_replicas=rollout or 1,
            learner_replicas=learner or 1,
            generate_s=phases["generate"], reward_s=phases["reward"], train_s=phases["train"], sync_s=phases["sync"],
            tokens_per_sample=median_present(_tokens_per_sample(r) for r in same),
            noise_scale=noise_from_steps(recs[-window:]),
            eval_s=median_present(_num(r.eval_seconds) for r in evals[-window:]),
            steps=len(same),
            cores=cores_of(same[-1].cores),
            turns=median_present(_get(r.tools, "turns") for r in same),
            tool_seconds=median_present(_get(r.tools, "wall_seconds") for r in same),
        )


def cores_of(d: Any) -> tuple[int, int] | None:
    """(rollout, learner) from {"rollout": n, "learner": m} with both at least 1, else None."""
    if not isinstance(d, dict):
        return None
    r, lr = d.get("rollout"), d.get("learner")
    ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (r, lr))
    return (r, lr) if ok else None


def noise_from_steps(records: Sequence[StepRecord], min_pairs: int = 5, z: float = 2.0) -> float | None:
    """B_simple = mean tr(Sigma) / mean |G|^2 over records with both estimates, else the median B_simple.

    One step's estimates are very noisy, and the ratio of means is the consistent estimator.
    With per-step estimates the answer is None (not measured) unless mean |G|^2 lies `z`
    standard errors above 0: in RL the true gradient is often small next to its noise, and
    dividing by a mean that could as well be 0 gives any value from tens to tens of
    thousands, which would swing the batch back and forth. Not measured, the planner keeps
    the spec's or the default noise scale.
    """
    pairs = [(float(r.noise_grad_sq), float(r.noise_trace)) for r in records
             if _finite(r.noise_grad_sq) and _finite(r.noise_trace)]
    if len(pairs) >= min_pairs:
        gs = [g for g, _ in pairs]
        g_sq = sum(gs) / len(gs)
        stderr = math.sqrt(sum((g - g_sq) ** 2 for g in gs) / (len(gs) - 1) / len(gs))
        if g_sq <= z * stderr:
            return None
        trace = sum(t for _, t in pairs) / len(pairs)
        return max(trace, 0.0) / g_sq
    return median_present(_num(r.noise_scale) for r in records)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _ok(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _num(v: Any) -> float | None:
    return float(v) if _ok(v) else None


def _get(d: dict[str, Any], name: str) -> float | None:
    return _num(d.get(name))


def _tokens_per_sample(r: StepRecord) -> float | None:
    tokens, samples = _num(r.generated_tokens), _num(r.batch_samples)
    return tokens / samples if tokens is not None and samples is not None else None


def median_present(values: Iterable[float | None]) -> float | None:
    """The median of the values that are there (None where a record lacks one), or None."""
    vs = [v for v in values if v is not None]
    return median(vs) if vs else None
