"""Samples-to-target and the learning-rate rules: the algorithmic half of the decision."""

from __future__ import annotations

import math
from typing import NamedTuple

# Without a measured noise scale, N_noise = 4 x referenceBatch. Why: the batch where lr
# was tuned is usually picked below the critical batch, and on the builtin task batches
# of 0.5x-2x the reference tracked one sample-indexed curve within the +-15% run-to-run
# spread (`rlscale run examples/quickstart.yaml` with batch.prompts fixed at 8, 16 and 32);
# with 4x the model predicts x0.90 and x1.20 there, x1.6 at 4x.
DEFAULT_NOISE_MULTIPLE = 4.0
# E_ref without a measurement: samples to target at the reference batch. Only ratios of E enter the
# decision, so this placeholder cancels there; no time-to-target rests on it (headline.py).
DEFAULT_SAMPLES_TO_TARGET = 100_000.0


class KnownSamples(NamedTuple):
    """A measured samples-to-target: the median over seeds at a batch, and the seeds' range."""

    samples: float
    batch: int
    low: float
    high: float
    seeds: int


# (model, task, difficulty, metric, target value) -> measured samples to target. The quickstart
# (examples/quickstart.yaml, the builtin model as `make run` trains it): at 32x8, staleness 0, seeds 0-5 reached
# 0.8 after 51,200, 30,720, 35,840, 25,600, 40,960 and 40,960 samples (`bench/staleness.py --staleness 0,1
# --to-target --seeds 0,1,2 --is-cap 2 --prompts 32`, and seeds 3,4,5; tests/plan/data/cpu_quickstart_measured.json).
# The stop before held 195,000 at 16x8, measured on the version-1 builtin model.
KNOWN_SAMPLES_TO_TARGET: dict[tuple, KnownSamples] = {
    ("builtin:tiny-arith", "builtin:arithmetic", 1, "eval/accuracy", 0.8): KnownSamples(38_400.0, 256, 25_600.0,
                                                                                       51_200.0, 6),
}
# A step at m x the optimal lr makes (2m - m^2) of the optimal progress in the quadratic
# model of McCandlish et al. (2018); floor it so m >= 2 reads as "10x the samples", not infinity.
MIN_PROGRESS = 0.1


def scaled_lr(lr: float, n: float, n_ref: float, rule: str) -> float:
    """lr for batch n by the rule: sqrt (Adam), linear (SGD) or none."""
    k = n / n_ref
    if rule == "sqrt":
        return lr * math.sqrt(k)
    if rule == "linear":
        return lr * k
    return lr


def lr_mismatch(n: float, n_ref: float, rule: str) -> float:
    """m = the rule's lr / the sqrt rule's lr, the batch-invariant one for Adam (Malladi et al. 2022)."""
    k = n / n_ref
    return {"sqrt": 1.0, "linear": math.sqrt(k), "none": 1.0 / math.sqrt(k)}[rule]


def mismatch_penalty(m: float) -> float:
    """Samples multiplier of running at m x the invariant lr: 1 / (2m - m^2), floored progress."""
    return 1.0 / max(2.0 * m - m * m, MIN_PROGRESS)


def noise_curve(n: float, n_ref: float, n_noise: float) -> float:
    """E(N) / E(N_ref) = (1 + N/N_noise) / (1 + N_ref/N_noise), at the retuned lr."""
    return (1.0 + n / n_noise) / (1.0 + n_ref / n_noise)


def samples_to_target(n: float, e_ref: float, n_ref: float, n_noise: float, rule: str = "sqrt") -> float:
    """E(N): the noise-scale curve through E_ref at N_ref, times the penalty of an untuned lr."""
    return e_ref * noise_curve(n, n_ref, n_noise) * mismatch_penalty(lr_mismatch(n, n_ref, rule))


def run_key(spec) -> tuple:
    """What a measured samples-to-target depends on: model, task, difficulty and target."""
    return (spec.model.path, spec.task.name, spec.task.difficulty, spec.target.metric, spec.target.value)


def reference_samples(key: tuple, n_ref: float, n_noise: float) -> tuple[float, bool]:
    """(E_ref at N_ref, known): moved along the noise curve from where it was measured, if it was."""
    known = KNOWN_SAMPLES_TO_TARGET.get(key)
    if known is None:
        return DEFAULT_SAMPLES_TO_TARGET, False
    return known.samples / noise_curve(known.batch, n_ref, n_noise), True


def samples_note(key: tuple, e_ref: float, e_known: bool, from_spec: bool) -> str | None:
    """The plan's note on its samples-to-target: a placeholder, or where the measurement came from."""
    if not e_known:
        return f"samples to target at the reference batch: {e_ref:,.0f} is a placeholder; only ratios decide the plan"
    known = KNOWN_SAMPLES_TO_TARGET.get(key)
    if from_spec or known is None:
        return None
    return (f"samples to target measured: {known.samples:,.0f} at {known.batch} samples a step, the median of "
            f"{known.seeds} seeds ({known.low:,.0f}-{known.high:,.0f})")
