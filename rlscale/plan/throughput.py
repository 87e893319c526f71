"""Throughput model: per-step phase times from the model shape and the accelerator profile."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rlscale.plan.profiles import AcceleratorProfile
from rlscale.plan.shapes import DTYPE_BYTES, ModelShape

# Adam update traffic per parameter: read weight, grad, m, v, fp32 master; write them back
# (mixed precision: 2 + 2 + 8 + 8 + 8 bytes; fp32: 8 + 4 + 8 + 8).
OPTIMIZER_BYTES_PER_PARAM = 28
# A plug-in reward is arbitrary Python (parsing, a sandboxed check): ~1 ms a sample until measured.
PLUGIN_REWARD_SECONDS = 1e-3


def decode_step_seconds(b: float, weight_bytes: float, kv_bytes_per_token: float, context: float,
                        bandwidth: float, flops: float, active_params: float) -> float:
    """Roofline time of one decode iteration with b sequences of mean context `context` in flight."""
    memory = (weight_bytes + b * context * kv_bytes_per_token) / bandwidth
    compute = 2.0 * active_params * b / flops
    return max(memory, compute)


def max_concurrency(memory: float, weight_bytes: float, kv_bytes_per_token: float, max_context: float) -> int:
    """Sequences whose full-length KV cache fits beside the weights: (M*util - W) / (c_max * kv)."""
    free = memory - weight_bytes
    return max(0, int(free // (max_context * kv_bytes_per_token)))


def crossover_concurrency(flops: float, bandwidth: float, dtype_bytes: float) -> float:
    """b* = F * dtype_bytes / (2 * BW): where decode turns compute-bound, KV traffic ignored."""
    return flops * dtype_bytes / (2.0 * bandwidth)


@dataclass(frozen=True)
class Phases:
    """Seconds of one training step per phase (no overlap in this version, so the step is their sum)."""

    generate: float
    reward: float
    train: float
    sync: float

    @property
    def total(self) -> float:
        return self.generate + self.reward + self.train + self.sync

    def times(self, other: Phases) -> Phases:
        return Phases(self.generate * other.generate, self.reward * other.reward,
                      self.train * other.train, self.sync * other.sync)

    def to_dict(self) -> dict[str, float]:
        return {"generate": self.generate, "reward": self.reward, "train": self.train, "sync": self.sync}

    @classmethod
    def from_dict(cls, d: dict[str, float]) -> Phases:
        return cls(*(float(d.get(p) or 0.0) for p in ("generate", "reward", "train", "sync")))


ONES = Phases(1.0, 1.0, 1.0, 1.0)


@dataclass(frozen=True)
class Generation:
    """How a step's generation runs on one rollout replica."""

    seconds: float
    concurrency: int  # sequences in flight per replica
    bound: str  # "memory" or "compute" at that concurrency
    tokens_per_second: float  # decode tokens/s of all replicas together


@dataclass(frozen=True)
class SystemModel:
    """Everything the phase-time formulas need; `scale` holds calibration factors per phase."""

    shape: ModelShape
    profile: AcceleratorProfile
    dtype: str
    prompt_tokens: float
    response_tokens: float
    max_new_tokens: int
    algorithm: str = "grpo"
    reference_model: bool = False  # klCoef > 0: one more forward pass per token
    zero_stage: int = 1
    micro_batch: int = 32
    rollout_gpus: int = 1  # GPUs per rollout replica (tensor parallel)
    learner_gpus: int = 1  # GPUs per learner replica
    reward_seconds_per_sample: float = 2e-5
    scale: Phases = field(default=ONES)

    # ----------------------------------------------------------------- devices

    @property
    def weight_bytes(self) -> float:
        return self.shape.weight_bytes(self.dtype)

    @property
    def kv_bytes(self) -> float:
        return self.shape.kv_bytes_per_token(self.dtype)

    def _share(self, replicas: int, gpus: int) -> float:
        """What one replica gets of the device numbers: gpus of them, or 1/replicas of a shared cpu host."""
        return 1.0 / replicas if self.profile.shared_host else float(max(gpus, 1))

    def rollout_device(self, replicas: int) -> tuple[float, float, float]:
        """(usable bandwidth, usable FLOP/s, KV+weights memory) of one rollout replica."""
        p, k = self.profile, self._share(replicas, self.rollout_gpus)
        memory = p.memory * p.memory_utilization * k
        if p.shared_host:
            memory = max(0.0, p.memory * p.memory_utilization - self.learner_memory(1)) * k
        bandwidth = p.memory_bandwidth * p.bandwidth_efficiency * k
        return bandwidth, p.flops(self.dtype) * p.decode_flops_efficiency * k, memory

    # ----------------------------------------------------------------- phases

    def generation(self, prompts: int, samples_per_prompt: int, replicas: int) -> Generation:
        """Prefill (compute-bound, one per prompt thanks to prefix caching) plus decode iterations
        at the KV-capped concurrency."""
        bw, fl, mem = self.rollout_device(replicas)
        cap = max_concurrency(mem, self.weight_bytes, self.kv_bytes, self.prompt_tokens + self.max_new_tokens)
        prompts_r = math.ceil(prompts / replicas)  # a group stays on one replica
        n = prompts_r * samples_per_prompt
        b = max(1, min(n, cap))
        context = self.prompt_tokens + self.response_tokens / 2.0
        t_iter = decode_step_seconds(b, self.weight_bytes, self.kv_bytes, context, bw, fl, self.shape.active)
        mem_t = (self.weight_bytes + b * context * self.kv_bytes) / bw
        iterations = n * self.response_tokens / b  # continuous batching refills freed slots
        decode = iterations * (self.profile.decode_iteration_overhead_s + t_iter)
        prefill = 2.0 * self.shape.active * prompts_r * self.prompt_tokens / fl
        seconds = prefill + decode + self.profile.generate_overhead_s
        tps = replicas * n * self.response_tokens / decode if decode > 0 else 0.0
        return Generation(seconds, b, "memory" if mem_t >= t_iter else "compute", tps)

    def train_flops_per_token(self) -> float:
        """6P for forward+backward, 2P per extra logprob pass (old-policy recompute, reference); PPO adds a critic."""
        p = self.shape.active
        passes = 1 + (1 if self.reference_model else 0)
        flops = 6.0 * p + 2.0 * p * passes
        if self.algorithm == "ppo":
            flops += 6.0 * p + 2.0 * p  # critic: train + the value pass for GAE
        return flops

    def _learner_world(self, replicas: int) -> int:
        return replicas * (1 if self.profile.shared_host else max(self.learner_gpus, 1))

    def train_seconds(self, samples: int, replicas: int) -> float:
        p = self.profile
        world = self._learner_world(replicas)
        # a cpu host is one machine: extra ranks split the same cores
        devices = 1.0 if p.shared_host else float(world)
        tokens = samples * (self.prompt_tokens + self.response_tokens)
        compute = self.train_flops_per_token() * tokens / (p.flops(self.dtype) * p.train_mfu * devices)
        # ranks run their micro-batches in parallel, except on a cpu host whose cores are already busy
        micro = math.ceil(samples / (self.micro_batch * (1 if p.shared_host else replicas))) * p.micro_batch_overhead_s
        models = 2 if self.algorithm == "ppo" else 1
        grad_bytes = self.shape.params * DTYPE_BYTES[self.dtype] * models
        allreduce = 2.0 * (world - 1) / world * grad_bytes / p.collective_bandwidth if world > 1 else 0.0
        shards = world if (self.zero_stage >= 1 and not p.shared_host) else 1
        optimizer_bytes = OPTIMIZER_BYTES_PER_PARAM * self.shape.params * models
        optimizer = optimizer_bytes / (p.memory_bandwidth * p.bandwidth_efficiency * shards)
        return compute + micro + allreduce + optimizer

    def sync_seconds(self) -> float:
        return self.weight_bytes / self.profile.interconnect_bandwidth + self.profile.sync_latency_s

    def phases(self, prompts: int, samples_per_prompt: int, rollout: int, learner: int) -> Phases:
        """Calibrated phase seconds of one step."""
        n = prompts * samples_per_prompt
        raw = Phases(
            generate=self.generation(prompts, samples_per_prompt, rollout).seconds,
            reward=n * self.reward_seconds_per_sample,
            train=self.train_seconds(n, learner),
            sync=self.sync_seconds(),
        )
        return raw.times(self.scale)

    # ----------------------------------------------------------------- memory

    def learner_memory(self, replicas: int) -> float:
        """Bytes of training state per learner device (weights, grads, Adam), ZeRO-sharded by stage."""
        world = self._learner_world(replicas)
        w = g = float(DTYPE_BYTES[self.dtype])
        opt = 8.0 if self.dtype == "float32" else 12.0  # m, v (+ fp32 master copy)
        z = self.zero_stage
        per_param = w / (world if z >= 3 else 1) + g / (world if z >= 2 else 1) + opt / (world if z >= 1 else 1)
        total = per_param * self.shape.params * (2 if self.algorithm == "ppo" else 1)
        if self.reference_model:
            total += w * self.shape.params / (world if z >= 3 else 1)
        if self.profile.shared_host:
            total *= world  # every rank lives on the same host
        return total

    def infeasible(self, rollout: int, learner: int) -> str | None:
        """Why this split cannot run (naming the field to change), or None."""
        p = self.profile
        gb = 1e9
        if not p.shared_host:
            limit = p.memory * p.memory_utilization * max(self.learner_gpus, 1)
            need = self.learner_memory(learner) * max(self.learner_gpus, 1)
            if need > limit:
                zero = "raise learner.zeroStage, " if self.zero_stage < 3 else ""
                return (f"learner.replicas: {learner} learner replica(s) need {need / gb:.0f} GB of training state "
                        f"each, above {limit / gb:.0f} GB usable; {zero}raise learner.gpusPerReplica, or allow more "
                        "learner replicas (learner.maxReplicas, budget.gpus)")
        elif self.learner_memory(learner) > p.memory * p.memory_utilization:
            return (f"hardware.memory: {p.memory / gb:.0f} GB cannot hold {self.learner_memory(learner) / gb:.1f} GB "
                    "of training state; use a smaller model or set hardware.memory")
        _, _, mem = self.rollout_device(rollout)
        cap = max_concurrency(mem, self.weight_bytes, self.kv_bytes, self.prompt_tokens + self.max_new_tokens)
        if cap < 1:
            return (f"rollout.gpusPerReplica: {self.rollout_gpus} GPU(s) per replica leave no room for a sequence's "
                    f"KV cache beside {self.weight_bytes / gb:.1f} GB of weights ({mem / gb:.0f} GB usable); "
                    "use more GPUs per replica")
        return None
