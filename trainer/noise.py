"""Gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018, appendix A.1).

From squared gradient norms measured at two batch sizes B_small < B_big:
  |G|^2     ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
  tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)
Each estimate alone is noisy (either can be negative), so both are smoothed with an
EMA before dividing.

Units: B counts samples in whole prompt groups: micro-batches may split a group, but the small
batch is taken at a group-aligned boundary (batching.MicroPlan), after the first part of the groups;
and the learner trains only on the samples it keeps (GRPO drops groups whose
rewards are all equal). The planner's batch counts every sample of a step, so the
estimate is converted once, by `in_batch_samples`, before anything reads it.
"""

from __future__ import annotations

import math


def noise_components(g_small_sq: float, g_big_sq: float, b_small: float, b_big: float) -> tuple[float, float]:
    """Unbiased estimates (|G|^2, tr(Sigma)) from squared norms at batch sizes b_small < b_big."""
    if not 0 < b_small < b_big:
        raise ValueError(f"noise scale: need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}")
    g_sq = (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small)
    trace = (g_small_sq - g_big_sq) / (1.0 / b_small - 1.0 / b_big)
    return g_sq, trace


def boundary_pair(small_sq: float, big_sq: float, b_small: float, b_big: float, sizes: tuple[float, float],
                  denom: float) -> tuple[float, float]:
    """(|G|^2, tr(Sigma)) from squared norms of gradients accumulated as sums divided by `denom` (the
    batch's loss normaliser): each is rescaled to the mean over its own part (`sizes`: the parts' loss
    tokens, or sequences), so the norms compare. (nan, nan) without two distinct sizes."""
    if not (0 < b_small < b_big and sizes[0] > 0 and sizes[1] > 0):
        return math.nan, math.nan
    return noise_components(small_sq * (denom / sizes[0]) ** 2, big_sq * (denom / sizes[1]) ** 2, b_small, b_big)


def in_batch_samples(g_sq: float, trace: float, trained: int, batch: int) -> tuple[float, float]:
    """(|G|^2, tr(Sigma)) per trained sample -> per sample of the whole step's batch.

    The loss is a mean over the `trained` samples, so a step of `batch` samples has the
    gradient noise of `trained` samples: tr(Sigma)/trained = (tr(Sigma) * batch/trained)/batch.
    |G|^2 is that of the mean gradient and keeps its value; B_simple grows by batch/trained.
    """
    if not 0 < trained <= batch:
        raise ValueError(f"noise scale: need 0 < trained <= batch samples, got trained={trained}, batch={batch}")
    return g_sq, trace * batch / trained


class NoiseScale:
    """EMA-smoothed B_simple; `update` returns the current estimate (None until |G|^2 > 0)."""

    def __init__(self, decay: float = 0.9):
        self.decay = decay
        self.g_sq: float | None = None
        self.trace: float | None = None
        self.count = 0
        self.last: tuple[float, float] | None = None  # this step's raw (|G|^2, tr(Sigma)) estimates

    def update(self, g_small_sq: float, g_big_sq: float, b_small: float, b_big: float) -> float | None:
        return self.add(*noise_components(g_small_sq, g_big_sq, b_small, b_big))

    def add(self, g_sq: float, trace: float) -> float | None:
        """Fold in one step's (|G|^2, tr(Sigma)); returns the current estimate."""
        if not (math.isfinite(g_sq) and math.isfinite(trace)):
            self.last = None
            return self.value
        self.last = (g_sq, trace)
        if self.g_sq is None:
            self.g_sq, self.trace = g_sq, trace
        else:
            d = self.decay
            self.g_sq = d * self.g_sq + (1 - d) * g_sq
            self.trace = d * self.trace + (1 - d) * trace
        self.count += 1
        return self.value

    @property
    def value(self) -> float | None:
        if self.g_sq is None or self.g_sq <= 0 or self.trace is None:
            return None
        return max(self.trace, 0.0) / self.g_sq

    def state_dict(self) -> dict:
        return {"decay": self.decay, "g_sq": self.g_sq, "trace": self.trace, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.decay, self.g_sq, self.trace, self.count = state["decay"], state["g_sq"], state["trace"], state["count"]


# --- squared norms of the accumulated gradient, per ZeRO stage --------------------------------------


def local_grad_sq(module) -> float:
    """|g|^2 of a rank's locally accumulated gradient (ZeRO 0/1: p.grad holds it until step())."""
    total = 0.0
    for p in module.parameters():
        if p.grad is not None:
            total += p.grad.float().pow(2).sum().item()
    return total


def partition_grad_sq(engine) -> float:
    """This rank's share of |g|^2 of the gradient accumulated so far over ALL ranks, at ZeRO 2 or 3:
    there each backward reduces the micro-batch's gradient (averaged over ranks) into the partition the
    rank owns, so the partitions' squared norms summed over ranks are the global gradient's |g|^2.
    Divided by the loss scale's square (fp16). Reads DeepSpeed 0.19's partition buffers:
    ZeRO-3 through deepspeed.utils.safe_get_local_grad, ZeRO-2 through the optimizer's accumulated
    per-group tensors (the same ones finalize_gradient_accumulation_boundary flattens)."""
    opt = engine.optimizer
    if engine.zero_optimization_stage() == 3:
        from deepspeed.utils import safe_get_local_grad

        total = sum(float(g.float().pow(2).sum()) for p in engine.module.parameters()
                    if p.requires_grad and (g := safe_get_local_grad(p)) is not None)
    else:
        total = sum(_stage2_group_sq(opt, i) for i in range(len(opt.bit16_groups)))
    scale = float(getattr(opt, "loss_scale", 1.0) or 1.0)
    return total / scale**2


def _stage2_group_sq(opt, i: int) -> float:
    """|g|^2 of param group i's partition of a ZeRO-2 optimizer between backward and step()."""
    if opt._use_compact_grad_partition_buffer(i):  # low-precision params, float32 accumulation
        buf = opt.averaged_gradients.get(i)
        flat = getattr(buf, "flat_partition", None)
        return float(flat.float().pow(2).sum()) if flat is not None else 0.0
    tensors = opt.all_grad_tensors.get(i) if isinstance(opt.all_grad_tensors, dict) else None
    if not tensors:
        return 0.0
    # The partition starts first_offset elements into its first tensor and spans partition_size elements.
    size, done, total = int(opt.partition_size[i]), 0, 0.0
    for k, t in enumerate(tensors):
        flat = t.reshape(-1)
        offset = int(opt.first_offset[i]) if k == 0 else 0
        n = min(flat.numel() - offset, size - done)
        if n <= 0:
            break
        total += float(flat[offset:offset + n].float().pow(2).sum())
        done += n
    return total
