"""Calibration: measured step phases and gradient noise scale, fed back into the planner."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from statistics import median
from typing import Any

PHASES = ("generate", "reward", "train", "sync")


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
        """Mean generated tokens per sample, if measured (responseTokens, else tokensPerSample)."""
        for v in (self.response_tokens, self.tokens_per_sample):
            if _ok(v):
                return float(v)
        return None

    @classmethod
    def from_steps(cls, records: Iterable[Mapping[str, Any]], last: int = 10) -> Calibration:
        """Median over the last `last` step records that ran the latest configuration (robust to slow outliers)."""
        recs = [r for r in records if isinstance(r, Mapping)]
        if not recs:
            return cls()
        key = _config(recs[-1])
        same = [r for r in recs if _config(r) == key][-last:]
        phases = {p: _median(_get(r.get("phases") or {}, p) for r in same) for p in PHASES}
        noise = _median(_get(r, "noiseScale", "noise_scale") for r in recs[-last:])
        prompts, spp, rollout, learner = key
        return cls(
            prompts=prompts, samples_per_prompt=spp, rollout_replicas=rollout or 1, learner_replicas=learner or 1,
            generate_s=phases["generate"], reward_s=phases["reward"], train_s=phases["train"], sync_s=phases["sync"],
            prompt_tokens=_median(_get(r, "promptTokens", "prompt_tokens") for r in same),
            response_tokens=_median(_get(r, "responseTokens", "response_tokens") for r in same),
            tokens_per_sample=_median(_get(r, "tokensPerSample", "tokens_per_sample") for r in same),
            noise_scale=noise, steps=len(same),
        )


def _ok(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _get(d: Mapping[str, Any], *names: str) -> float | None:
    for n in names:
        if n in d and _ok(d[n]):
            return float(d[n])
    return None


def _median(values: Iterable[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return median(vs) if vs else None


def _config(r: Mapping[str, Any]) -> tuple[int | None, int | None, int | None, int | None]:
    def i(*names: str) -> int | None:
        v = _get(r, *names)
        return int(v) if v is not None else None
    return (i("prompts"), i("samplesPerPrompt", "samples_per_prompt"),
            i("rolloutReplicas", "rollout_replicas"), i("learnerReplicas", "learner_replicas"))
