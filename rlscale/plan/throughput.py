"""Throughput model: per-step phase times from the model shape and the accelerator profile."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rlscale.cpu_split import split_cores
from rlscale.plan.placement import (
    broadcast_seconds,
    handover_seconds,
    object_store_seconds,
    sleep_seconds,
    wake_seconds,
)
from rlscale.plan.profiles import AcceleratorProfile
from rlscale.plan.shapes import DTYPE_BYTES, ModelShape
from rlscale.plan.staleness import overlapped_step

# Adam update traffic per parameter: read weight, grad, m, v, fp32 master; write them back
# (mixed precision: 2 + 2 + 8 + 8 + 8 bytes; fp32: 8 + 4 + 8 + 8).
OPTIMIZER_BYTES_PER_PARAM = 28
# A plug-in reward is arbitrary Python (parsing, a sandboxed check): ~1 ms a sample until measured.
PLUGIN_REWARD_SECONDS = 1e-3
# Activations kept for the backward pass, bytes per token per layer per 2 bytes of dtype, in units of the
# hidden size: 34 h without recomputation (Korthikanti et al. 2022, flash attention: no s^2 term); with
# gradient checkpointing only each layer's input (2 h) and one layer's full set during its recompute.
ACTIVATION_BYTES_PER_HIDDEN = 34.0
CHECKPOINTED_BYTES_PER_HIDDEN = 2.0
# The log-probs are gathered from an fp32 log-softmax over the vocabulary, one row per token.
LOGIT_BYTES = 4.0
# Sizes a tensor-parallel degree is suggested from.
TP_DEGREES = (1, 2, 4, 8, 16)


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
    """Seconds of one training step per phase. At staleness 0 the step is their sum (`total`); from
    staleness 1 on generation and reward overlap training (`step`)."""

    generate: float
    reward: float
    train: float
    sync: float

    @property
    def total(self) -> float:
        return self.generate + self.reward + self.train + self.sync

    def step(self, staleness: int = 0) -> float:
        """The step's seconds: the sum at staleness 0, max(generate + reward, train) + sync above."""
        return overlapped_step(self.generate, self.reward, self.train, self.sync, staleness)

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
    placement: str = "disaggregated"  # or "colocated": one engine per learner pod, on its GPUs
    weight_sync: str = "broadcast"  # or "object-store" (disaggregated)
    rollout_memory_utilization: float | None = None  # the engine's share of device memory; None: the profile's
    ranks_per_pod: int = 0  # learner ranks per pod; 0: one per GPU (one on cpu)
    gradient_checkpointing: bool = False
    group_size: int = 1  # samples per prompt: a replica must hold one group's KV cache at full length
    micro_batch_tokens: int | None = None  # batch.microBatchTokens: padded tokens per micro-batch
    # A shared cpu host's cores (`rlscale run`): generating ahead, the run splits them between the rollout
    # and the learner (rlscale/cpu_split.py) and each phase runs on its side's share. 0: each role has
    # cores or accelerators of its own whatever the staleness (pods, GPUs).
    host_cores: int = 0

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

    @property
    def rollout_utilization(self) -> float:
        return self.rollout_memory_utilization or self.profile.memory_utilization

    def rollout_device(self, replicas: int) -> tuple[float, float, float]:
        """(usable bandwidth, usable FLOP/s, KV+weights memory) of one rollout replica: its share of each
        GPU's memory less the engine's own overhead, times its GPUs."""
        p, k = self.profile, self._share(replicas, self.rollout_gpus)
        memory = max(0.0, p.memory * self.rollout_utilization - p.engine_overhead_bytes) * k
        if p.shared_host:
            memory = max(0.0, p.memory * self.rollout_utilization - self.learner_memory(1)) * k
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
        passes = 1 + (1 if self.reference_model else 0) + (1 if self.gradient_checkpointing else 0)
        flops = 6.0 * p + 2.0 * p * passes  # gradient checkpointing: the forward once more
        if self.algorithm == "ppo":
            flops += 6.0 * p + 2.0 * p  # critic: train + the value pass for GAE
        return flops

    def _learner_world(self, replicas: int) -> int:
        ranks = self.ranks_per_pod or (1 if self.profile.shared_host else max(self.learner_gpus, 1))
        return replicas * ranks

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
        return compute + micro + allreduce + optimizer + self.sleep_seconds()

    @property
    def overlaps(self) -> bool:
        """Whether generation can run beside training: disaggregated, on accelerators of their own or, on a
        cpu host, on cores of their own (phases_at). Colocated engines sleep while the learner trains."""
        return self.placement != "colocated"

    def core_split(self, phases: Phases) -> tuple[int, int] | None:
        """(rollout, learner) cores of a shared host generating ahead, split as `rlscale run` splits them:
        by the phases on every core (rlscale/cpu_split.py). None: nothing to split (pods, GPUs, one core)."""
        if not self.profile.shared_host or self.host_cores < 2 or not self.overlaps:
            return None
        split = split_cores(list(range(self.host_cores)), phases.generate + phases.reward, phases.train)
        return (len(split.rollout), len(split.learner)) if split else None

    def on_share(self, share: float) -> float:
        """How much longer a phase takes on `share` of the host's cores than on all of them (Amdahl,
        AcceleratorProfile.core_serial_fraction)."""
        f = self.profile.core_serial_fraction
        return f + (1.0 - f) / min(max(share, 1e-9), 1.0)

    def phases_at(self, phases: Phases, staleness: int) -> tuple[Phases, tuple[int, int] | None]:
        """The phases (on every core) as they run at this staleness, and the core split they run on. On a
        shared cpu host generating ahead each side runs on its share of the cores: the quickstart at 32x8
        generated in 0.37 s on one core of two against 0.27 s on both and trained in 0.58 s against 0.38 s,
        so staleness 1 ran at x1.15 the synchronous loop's samples/s, not the x1.6 its phases on every
        core would give (docs/examples/quickstart-staleness-sweep/sweep.md)."""
        split = self.core_split(phases) if staleness > 0 else None
        if split is None:
            return phases, None
        g, t = (self.on_share(n / sum(split)) for n in split)
        return Phases(phases.generate * g, phases.reward * g, phases.train * t, phases.sync), split

    def step_seconds(self, phases: Phases, staleness: int = 0) -> float:
        """One step at this staleness (phases as they run: phases_at): overlapped where the placement
        allows, else the sum."""
        return phases.step(staleness if self.overlaps else 0)

    def sleep_seconds(self) -> float:
        """Colocated on GPUs: the engine's sleep before training, which the driver times in the train phase."""
        if self.placement != "colocated" or self.profile.shared_host:
            return 0.0
        return sleep_seconds(self.weight_bytes, self.rollout_gpus, self.profile.host_bandwidth)

    def sync_seconds(self, rollout: int = 1, learner: int = 1) -> float:
        """New weights into every engine: broadcast (flat in replicas) or the object store (W x R through
        rank 0's NIC). Colocated: the engines wake, rank 0's own pod takes the weights on the GPU and the
        other pods' engines over the network by the same method; ZeRO-3 gathers the shards first."""
        p, w = self.profile, self.weight_bytes
        if self.placement != "colocated":
            return self._network_sync(rollout)
        world = self._learner_world(learner)
        gather = (world - 1) / world * w / p.collective_bandwidth if self.zero_stage >= 3 and world > 1 else 0.0
        local = handover_seconds(w, p.memory_bandwidth * p.bandwidth_efficiency)
        remote = self._network_sync(rollout - 1) - p.sync_latency_s if rollout > 1 else 0.0
        wake = 0.0 if p.shared_host else wake_seconds(w, self.rollout_gpus, p.host_bandwidth)
        return wake + max(local, remote) + gather + p.sync_latency_s

    def _network_sync(self, replicas: int) -> float:
        p = self.profile
        if self.weight_sync == "object-store":
            return object_store_seconds(self.weight_bytes, p.interconnect_bandwidth, p.sync_latency_s, replicas)
        return broadcast_seconds(self.weight_bytes, p.interconnect_bandwidth, p.sync_latency_s, replicas)

    def phases(self, prompts: int, samples_per_prompt: int, rollout: int, learner: int) -> Phases:
        """Calibrated phase seconds of one step."""
        n = prompts * samples_per_prompt
        raw = Phases(
            generate=self.generation(prompts, samples_per_prompt, rollout).seconds,
            reward=n * self.reward_seconds_per_sample,
            train=self.train_seconds(n, learner),
            sync=self.sync_seconds(rollout, learner),
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

    def activation_bytes_per_token(self) -> float:
        """Activations kept per token for the backward pass: 34 h bytes per layer (2-byte dtype), or 2 h
        per layer plus one layer recomputed with gradient checkpointing, and the fp32 log-softmax row."""
        h, layers = float(self.shape.hidden_size), self.shape.layers
        scale = DTYPE_BYTES[self.dtype] / 2.0
        if self.gradient_checkpointing:
            per_token = (CHECKPOINTED_BYTES_PER_HIDDEN * layers + ACTIVATION_BYTES_PER_HIDDEN) * h * scale
        else:
            per_token = ACTIVATION_BYTES_PER_HIDDEN * layers * h * scale
        return per_token + LOGIT_BYTES * self.shape.vocab_size

    def micro_batch_tokens_max(self) -> float:
        """Padded tokens of one micro-batch: microBatch sequences of full length, or microBatchTokens."""
        tokens = self.micro_batch * (self.prompt_tokens + self.max_new_tokens)
        return min(tokens, self.micro_batch_tokens) if self.micro_batch_tokens else tokens

    def activation_note(self, learner: int) -> str | None:
        """A warning when the configured micro-batch's activations overflow what the state leaves (one
        sequence fits, or the plan would have been refused): the fields that bring it down."""
        p, gb = self.profile, 1e9
        if p.shared_host:
            return None
        states, per_token = self.learner_memory(learner), self.activation_bytes_per_token()
        limit, tokens = p.memory * p.memory_utilization, self.micro_batch_tokens_max()
        if states + tokens * per_token <= limit:
            return None
        fit = int((limit - states) // per_token)
        ckpt = "" if self.gradient_checkpointing else ", or set learner.gradientCheckpointing: true"
        return (f"learner activations at {tokens:,.0f} tokens per micro-batch need {tokens * per_token / gb:.0f} GB "
                f"per GPU beside {states / gb:.0f} GB of training state, above {limit / gb:.0f} GB usable: set "
                f"batch.microBatchTokens to at most {fit:,} (or lower batch.microBatch){ckpt}")

    def infeasible(self, rollout: int, learner: int) -> str | None:
        """Why this split cannot run (naming the field to change), or None."""
        return self.learner_infeasible(learner) or self.rollout_infeasible(rollout)

    def learner_infeasible(self, learner: int) -> str | None:
        """Training state + activations within a GPU's usable memory (colocated: the state also beside the
        awake engine's share); on cpu the whole host's training state."""
        p, gb = self.profile, 1e9
        states = self.learner_memory(learner)
        if p.shared_host:
            if states > p.memory * p.memory_utilization:
                return (f"hardware.memory: {p.memory / gb:.0f} GB cannot hold {states / gb:.1f} GB "
                        "of training state; use a smaller model or set hardware.memory")
            return None
        # One sequence's activations must fit: the learner cannot train below that (a larger micro-batch
        # that overflows is a note with the fix, activation_note).
        limit = p.memory * p.memory_utilization
        acts = (self.prompt_tokens + self.max_new_tokens) * self.activation_bytes_per_token()
        zero = "raise learner.zeroStage, " if self.zero_stage < 3 else ""
        ckpt = "set learner.gradientCheckpointing: true, " if not self.gradient_checkpointing else ""
        if states + acts > limit:
            return (f"learner.replicas: {learner} learner replica(s) need {states / gb:.0f} GB of training state "
                    f"+ {acts / gb:.1f} GB of activations (one sequence) per GPU, above {limit / gb:.0f} GB usable; "
                    f"{zero}{ckpt}"
                    "raise learner.gpusPerReplica, or allow more learner replicas "
                    "(learner.maxReplicas, budget.gpus)")
        if self.placement == "colocated":
            engine = p.memory * self.rollout_utilization
            if states + engine > limit:
                return (f"rollout.gpuMemoryUtilization: {self.rollout_utilization:.2g} (colocated) gives the engine "
                        f"{engine / gb:.0f} GB of each GPU beside {states / gb:.0f} GB of learner state, above "
                        f"{limit / gb:.0f} GB usable; lower it, {zero}allow more learner replicas, "
                        "or set placement: disaggregated")
        return None

    def tensor_parallel_for_group(self) -> int | None:
        """The fewest GPUs per engine that hold the weights and one group's KV cache, or None."""
        p = self.profile
        need = self.group_size * (self.prompt_tokens + self.max_new_tokens) * self.kv_bytes
        per_gpu = p.memory * self.rollout_utilization - p.engine_overhead_bytes
        return next((t for t in TP_DEGREES if per_gpu * t - self.weight_bytes >= need), None)

    def rollout_infeasible(self, rollout: int) -> str | None:
        """The engine (its share of memory less overhead) must hold the weights and the KV cache of one
        prompt group at full length: a group is the unit a replica decodes together."""
        gb, cmax = 1e9, self.prompt_tokens + self.max_new_tokens
        _, _, mem = self.rollout_device(rollout)
        need = self.group_size * cmax * self.kv_bytes
        if mem - self.weight_bytes >= need:
            return None
        what = (f"{self.weight_bytes / gb:.1f} GB of weights leave {max(0.0, mem - self.weight_bytes) / gb:.1f} GB "
                f"of KV cache in {mem / gb:.1f} GB usable (gpuMemoryUtilization {self.rollout_utilization:.2g}, less "
                f"{self.profile.engine_overhead_bytes / gb:.0f} GB engine overhead a GPU), below one group's "
                f"{self.group_size} sequences x {cmax:.0f} tokens ({need / gb:.1f} GB)")
        if self.profile.shared_host:
            return f"hardware.memory: {what}; use a smaller model or set hardware.memory"
        t = self.tensor_parallel_for_group()
        if self.placement == "colocated":
            fix = (f"set learner.gpusPerReplica: {t} (a colocated engine spans its learner pod's GPUs), "
                   if t else "") + "raise rollout.gpuMemoryUtilization, or set placement: disaggregated"
            return f"learner.gpusPerReplica: {self.rollout_gpus} GPU(s) per colocated engine: {what}; {fix}"
        fix = f"set rollout.gpusPerReplica: {t} (tensor parallelism)" if t else "use a smaller model"
        return f"rollout.gpusPerReplica: {self.rollout_gpus} GPU(s) per replica: {what}; {fix}"
