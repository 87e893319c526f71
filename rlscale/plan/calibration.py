"""Calibration: measured step phases and gradient noise scale, fed back into the planner."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from statistics import median
from typing import Any

from rlscale.metrics_names import PHASES

__all__ = ["PHASES", "Calibration", "noise_from_steps"]


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

    def measured(self, phase: str) -> float | None:
        v = getattr(self, f"{phase}_s")
        return float(v) if _ok(v) else None

    def response_length(self) -> float | None:
        """Mean generated tokens per sample, if measured (response_tokens, else tokens_per_sample)."""
        for v in (self.response_tokens, self.tokens_per_sample):
            if _ok(v):
                return float(v)
        return None

    @classmethod
    def from_steps(cls, records: Iterable[Mapping[str, Any]], last: int = 10,
                   noise_last: int | None = None) -> Calibration:
        """Median over the last `last` step records that ran the latest configuration (robust to slow outliers).

        Records are the driver's, as in metrics.jsonl (snake_case). The noise scale comes from
        the last `noise_last` records (default `last`) of any configuration: see noise_from_steps.
        """
        recs = [r for r in records if isinstance(r, Mapping)]
        if not recs:
            return cls()
        key = _config(recs[-1])
        same = [r for r in recs if _config(r) == key][-last:]
        phases = {p: median_present(_get(r.get("phases") or {}, p) for r in same) for p in PHASES}
        window = noise_last or last
        # An eval runs on the rollout replicas only: any batch at the same replica count will do.
        evals = [r for r in recs if _config(r)[2] == key[2]]
        prompts, spp, rollout, learner = key
        return cls(
            prompts=prompts, samples_per_prompt=spp, rollout_replicas=rollout or 1, learner_replicas=learner or 1,
            generate_s=phases["generate"], reward_s=phases["reward"], train_s=phases["train"], sync_s=phases["sync"],
            prompt_tokens=median_present(_get(r, "prompt_tokens") for r in same),
            response_tokens=median_present(_get(r, "response_tokens") for r in same),
            tokens_per_sample=median_present(_tokens_per_sample(r) for r in same),
            noise_scale=noise_from_steps(recs[-window:]),
            eval_s=median_present(_get(r, "eval_seconds") for r in evals[-window:]),
            steps=len(same),
        )


def noise_from_steps(records: list[Mapping[str, Any]], min_pairs: int = 5, z: float = 2.0) -> float | None:
    """B_simple = mean tr(Sigma) / mean |G|^2 over records with both estimates, else the median B_simple.

    One step's estimates are very noisy, and the ratio of means is the consistent estimator.
    With per-step estimates the answer is None (not measured) unless mean |G|^2 lies `z`
    standard errors above 0: in RL the true gradient is often small next to its noise, and
    dividing by a mean that could as well be 0 gives any value from tens to tens of
    thousands, which would swing the batch back and forth. Not measured, the planner keeps
    the spec's or the default noise scale.
    """
    pairs = [(float(r["noise_grad_sq"]), float(r["noise_trace"])) for r in records
             if _finite(r.get("noise_grad_sq")) and _finite(r.get("noise_trace"))]
    if len(pairs) >= min_pairs:
        gs = [g for g, _ in pairs]
        g_sq = sum(gs) / len(gs)
        stderr = math.sqrt(sum((g - g_sq) ** 2 for g in gs) / (len(gs) - 1) / len(gs))
        if g_sq <= z * stderr:
            return None
        trace = sum(t for _, t in pairs) / len(pairs)
        return max(trace, 0.0) / g_sq
    return median_present(_get(r, "noise_scale") for r in records)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _ok(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _get(d: Mapping[str, Any], name: str) -> float | None:
    return float(d[name]) if _ok(d.get(name)) else None


def _tokens_per_sample(r: Mapping[str, Any]) -> float | None:
    tokens, samples = _get(r, "generated_tokens"), _get(r, "batch_samples")
    return tokens / samples if tokens is not None and samples is not None else None


def median_present(values: Iterable[float | None]) -> float | None:
    """The median of the values that are there (None where a record lacks one), or None."""
    vs = [v for v in values if v is not None]
    return median(vs) if vs else None


def _config(r: Mapping[str, Any]) -> tuple[int | None, int | None, int | None, int | None]:
    def i(name: str) -> int | None:
        v = _get(r, name)
        return int(v) if v is not None else None
    return i("prompts"), i("samples_per_prompt"), i("rollout_replicas"), i("learner_replicas")
