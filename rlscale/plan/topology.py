"""The learner's topology (pods, GPUs a pod, nodes), its collectives by ZeRO stage, and the longest response
of a batch: the terms docs/planner.md section 1 derives (Training, Weight sync, Generation)."""

from __future__ import annotations

import math

# A colocated learner's CUDA context and allocator residue once its states are offloaded and the cache emptied
# (an assumption, not measured: the context of a CUDA 12 process is 0.5-1 GB).
LEARNER_CONTEXT_BYTES = 1e9


def nodes_of(world: int, nvlink_ranks: int) -> int:
    """NVLink domains `world` ranks span, `nvlink_ranks` to each: a learner pod's GPUs (a pod is at most one
    node, and NCCL sees two pods, even on one node, as two hosts)."""
    return max(1, math.ceil(world / max(1, nvlink_ranks)))


def collective_seconds(total_bytes: float, world: int, nvlink_ranks: int, node_bandwidth: float,
                       network_bandwidth: float) -> float:
    """One ring all-gather or reduce-scatter of `total_bytes` over `world` ranks: each rank moves
    (w-1)/w of the bytes, and a ring runs at its slowest link, NVLink (`node_bandwidth`, the profile's
    collective bandwidth) inside one pod, the network (`network_bandwidth`, hardware.interconnectBandwidth)
    once the ranks span several pods. An all-reduce is two of these."""
    if world <= 1:
        return 0.0
    link = node_bandwidth if nodes_of(world, nvlink_ranks) == 1 else min(node_bandwidth, network_bandwidth)
    return (world - 1) / world * total_bytes / link


def zero_collectives(stage: int, micro_batches: int, forward_passes: int) -> tuple[float, float]:
    """(weight-sized, gradient-sized) collectives of one step per rank, by ZeRO stage, each one all-gather or
    reduce-scatter (collective_seconds) of the whole model's bytes:

    - stage 0/1: one gradient all-reduce at the step's end (2 gradient-sized);
    - stage 2: a gradient reduce-scatter in every micro-batch's backward, one all-gather of the updated
      weights at the end;
    - stage 3: the weights gathered for every pass over every micro-batch (`forward_passes` forwards,
      one more for the backward) and the gradients reduce-scattered in every backward.
    """
    m = max(1, micro_batches)
    if stage >= 3:
        return float(m * (forward_passes + 1)), float(m)
    if stage == 2:
        return 1.0, float(m)
    return 0.0, 2.0


def response_scale(mean: float, cap: float) -> float:
    """The exponential's scale mu whose lengths, cut at `cap`, average `mean`: mu (1 - exp(-cap / mu)) = mean
    (bisection; the left side grows with mu from 0 to cap)."""
    if mean <= 0:
        return 0.0
    if mean >= cap:
        return math.inf
    lo, hi = mean, mean
    while hi * -math.expm1(-cap / hi) < mean:
        hi *= 2.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if mid * -math.expm1(-cap / mid) < mean else (lo, mid)
    return (lo + hi) / 2.0


def expected_longest(mean: float, cap: float, n: int) -> float:
    """Expected longest of `n` responses whose lengths are exponential with the scale that averages `mean`
    once cut at `cap` (the most even distribution of a positive length with a known mean):
    E[max] = integral_0^cap 1 - F(x)^n dx = mu * sum_{k=1..n} U^k / k, with U = F(cap) = 1 - exp(-cap / mu).
    n = 1 gives the mean; without a cap it is mu * H_n, the harmonic number."""
    if n <= 1 or mean <= 0:
        return max(0.0, min(mean, cap))
    mu = response_scale(mean, cap)
    if math.isinf(mu):
        return cap
    u = -math.expm1(-cap / mu)
    total, term = 0.0, 1.0
    for k in range(1, n + 1):
        term *= u
        total += term / k
        if term / k < 1e-12 * total:
            break
    return min(cap, mu * total)


def sharding_text(stage: int, world: int, pods: int, gpus_per_pod: int, nvlink_ranks: int) -> str:
    """The learner's layout in words: pods x GPUs, the ZeRO stage and what it shards over which link."""
    domains = nodes_of(world, nvlink_ranks)
    where = "inside one pod's NVLink" if domains == 1 else f"across {domains} pods over the network"
    what = {0: "nothing sharded", 1: "optimizer states sharded", 2: "optimizer states and gradients sharded",
            3: "weights, gradients and optimizer states sharded"}[min(3, stage)]
    if world <= 1:
        return f"{pods} pod x {gpus_per_pod} GPU, ZeRO-{stage} (one rank: nothing to shard)"
    return f"{pods} pod(s) x {gpus_per_pod} GPUs, ZeRO-{stage} over {world} ranks ({what}, {where})"
