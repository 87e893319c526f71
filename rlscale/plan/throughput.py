"""Throughput model: per-step phase times from the model shape and the accelerator profile."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rlscale.cpu_split import split_cores
from rlscale.plan.lora import FROZEN_TRAIN_FLOPS_PER_PARAM
from rlscale.plan.placement import (
    TRANSFER_BUCKET_BYTES,
    WAKE_KV_SECONDS,
    broadcast_seconds,
    handover_seconds,
    transfer_backend,
)
from rlscale.plan.profiles import AcceleratorProfile
from rlscale.plan.shapes import DTYPE_BYTES, ModelShape
from rlscale.plan.staleness import overlapped_step
from rlscale.plan.topology import (
    LEARNER_CONTEXT_BYTES,
    collective_seconds,
    expected_longest,
    nodes_of,
    zero_collectives,
)

# Adam update traffic per parameter: read weight, grad, m, v, fp32 master; write them back
# (mixed precision: 2 + 2 + 8 + 8 + 8 bytes; fp32: 8 + 4 + 8 + 8).
OPTIMIZER_BYTES_PER_PARAM = 28
# A plug-in reward is arbitrary Python (parsing, a sandboxed check): ~1 ms a sample until measured.
PLUGIN_REWARD_SECONDS = 1e-3
# Activations a Hugging Face Qwen2 decoder layer keeps for the backward pass, bytes per token per layer per
# 2 bytes of dtype, in units of the hidden size h: about twice GPT's 34 h (Korthikanti et al. 2022). Measured
# in bf16 on CPU, the most of the shipped shapes measured (0.5B: 64.1 h, 1.5B: 67.4 h, 7B: 62.9 h; 0.5B the
# same at 256 and 2 x 1,024 tokens, so no s^2 term), by
#   .venv/bin/python bench/learner_memory.py --per-layer qwen/qwen2.5-0.5b,qwen/qwen2.5-1.5b --sequences 2 --length 1024
#   .venv/bin/python bench/learner_memory.py --per-layer qwen/qwen2.5-7b,qwen/qwen2.5-0.5b --sequences 1 --length 256
# With gradient checkpointing only each layer's input (2 h) and one layer's full set during its recompute.
ACTIVATION_BYTES_PER_HIDDEN = 67.4
CHECKPOINTED_BYTES_PER_HIDDEN = 2.0
# The log-probs are gathered from an fp32 log-softmax over the vocabulary, one row per token.
LOGIT_BYTES = 4.0
# The most sequences an engine is planned to decode at once (its max_num_seqs): vLLM's largest default,
# and within the token budget a step schedules (max_num_batched_tokens, which vLLM requires to be at least
# max_num_seqs; 8,192 and more by default on GPUs).
MAX_NUM_SEQS = 1024
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
    mini_batches: int = 1  # algorithm.miniBatches: optimiser steps per pass over the batch
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
    gpus_per_node: int = 8  # hardware.gpusPerNode: ranks within a node share NVLink, across nodes the network
    micro_batch_tokens: int | None = None  # batch.microBatchTokens: padded tokens per micro-batch
    # A shared cpu host's cores (`rlscale run`): generating ahead, the run splits them between the rollout
    # and the learner (rlscale/cpu_split.py) and each phase runs on its side's share. 0: each role has
    # cores or accelerators of its own whatever the staleness (pods, GPUs).
    host_cores: int = 0
    # Multi-turn rollouts (spec.task.tools): model turns per trajectory, each one more engine pass (its prefill
    # and call overhead; the decode of all turns is in response_tokens), and the step's wall seconds in tools
    # (the calls of a turn run in parallel in the tool workers; measured, else 0).
    turns: float = 1.0
    tool_seconds: float = 0.0
    # spec.lora (rlscale/plan/lora.py): the adapter's parameters (0: every parameter trains), and whether an
    # update sends merged weights instead of the adapter (lora.modulesToSave).
    lora_params: float = 0.0
    lora_merged_sync: bool = False

    # ----------------------------------------------------------------- devices

    @property
    def weight_bytes(self) -> float:
        return self.shape.weight_bytes(self.dtype)

    @property
    def trainable_params(self) -> float:
        return self.lora_params or float(self.shape.params)

    @property
    def adapter_bytes(self) -> float:
        return self.lora_params * DTYPE_BYTES[self.dtype]

    @property
    def engine_weight_bytes(self) -> float:
        """What an engine holds besides its KV cache: the weights and, with LoRA, its one adapter slot."""
        return self.weight_bytes + self.adapter_bytes

    @property
    def sync_bytes(self) -> float:
        """What a weight update moves: the model, or with LoRA the adapter."""
        return self.adapter_bytes if self.lora_params and not self.lora_merged_sync else self.weight_bytes

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
        """Prefill (compute-bound; a group shares its prompt's whole KV blocks by prefix caching) plus decode
        iterations at the KV-capped concurrency."""
        bw, fl, mem = self.rollout_device(replicas)
        cap = max_concurrency(mem, self.engine_weight_bytes, self.kv_bytes, self.prompt_tokens + self.max_new_tokens)
        prompts_r = math.ceil(prompts / replicas)  # a group stays on one replica
        n = prompts_r * samples_per_prompt
        b = max(1, min(n, cap, MAX_NUM_SEQS))
        context = self.prompt_tokens + self.response_tokens / 2.0
        t_iter = decode_step_seconds(b, self.engine_weight_bytes, self.kv_bytes, context, bw, fl, self.shape.active)
        mem_t = (self.engine_weight_bytes + b * context * self.kv_bytes) / bw
        # continuous batching refills freed slots, and the step waits for the longest response of the whole
        # batch (whichever replica has it)
        iterations = max(n * self.response_tokens / b, self.longest_response(prompts * samples_per_prompt))
        decode = iterations * (self.profile.decode_iteration_overhead_s + t_iter)
        shared = self.shared_prompt_tokens
        prefill = 2.0 * self.shape.active * (prompts_r * shared + n * (self.prompt_tokens - shared)) / fl
        # Turn k re-reads the context so far (prefix caching keeps the earlier turns'): one prefill and one call's
        # overhead per turn; the turns' tokens are decoded in `decode` already.
        seconds = (prefill + self.profile.generate_overhead_s) * self.turns + decode + self.tool_seconds
        tps = replicas * n * self.response_tokens / decode if decode > 0 else 0.0
        return Generation(seconds, b, "memory" if mem_t >= t_iter else "compute", tps)

    @property
    def shared_prompt_tokens(self) -> float:
        """A prompt's tokens that its group prefills once: vLLM's prefix cache holds whole blocks only and always
        computes a prompt's last token, so the rest is prefilled by every sample."""
        block = self.profile.kv_block_tokens
        return block * math.floor(max(self.prompt_tokens - 1.0, 0.0) / block)

    def turns_note(self, turns_measured: bool, tools_measured: bool) -> str:
        """What the plan's notes say of a multi-turn run's turns and tool seconds."""
        return (f"multi-turn: {self.turns:.2f} model turns per trajectory ("
                f"{'measured' if turns_measured else 'task.maxTurns, an upper bound'}), each one more engine pass; "
                f"{self.tool_seconds:.2f} s in tools per step ({'measured' if tools_measured else 'not measured yet'})")

    def longest_response(self, n: int) -> float:
        """Expected longest of n responses (topology.expected_longest): a step's generation ends with it."""
        return expected_longest(self.response_tokens, float(self.max_new_tokens), n)

    def logprob_passes(self) -> int:
        """Forward-only passes over the batch besides training's: the old-policy recompute, the reference."""
        # pi_old of the first mini-batch comes from its own forward in the update (trainer/updates.py
        # _old_logprobs): only the other mini-batches are recomputed, so one mini-batch recomputes nothing.
        return (1 if self.mini_batches > 1 else 0) + (1 if self.reference_model else 0)

    def train_flops_per_token(self) -> float:
        """6P for forward+backward, 2P per extra logprob pass (old-policy recompute, reference); PPO adds a critic."""
        p = self.shape.active
        passes = self.logprob_passes() + (1 if self.gradient_checkpointing else 0)
        flops = 6.0 * p + 2.0 * p * passes  # gradient checkpointing: the forward once more
        if self.lora_params:  # no weight gradients for the frozen base; the adapter's own are small
            flops += (FROZEN_TRAIN_FLOPS_PER_PARAM - 6.0) * p + 6.0 * self.lora_params
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
        micro = self.micro_batches(samples, replicas) * p.micro_batch_overhead_s
        models = 2 if self.algorithm == "ppo" else 1
        shards = world if (self.zero_stage >= 1 and not p.shared_host) else 1
        optimizer_bytes = OPTIMIZER_BYTES_PER_PARAM * self.trainable_params * models
        optimizer = optimizer_bytes / (p.memory_bandwidth * p.bandwidth_efficiency * shards)
        fixed = p.train_step_overhead_s
        return (compute + micro + self.collective_seconds(samples, replicas) + optimizer + fixed
                + self.offload_seconds(replicas))

    def micro_batches(self, samples: int, replicas: int) -> int:
        """Micro-batches each rank runs in a step: the ranks split the batch (on a cpu host they share the same
        cores, so every micro-batch counts)."""
        ranks = 1 if self.profile.shared_host else self._learner_world(replicas)
        return math.ceil(samples / (self.micro_batch * max(1, ranks)))

    def collective_seconds(self, samples: int, replicas: int) -> float:
        """The learner's ZeRO collectives of one step (topology.zero_collectives), each over the ring's slowest
        link: NVLink inside a node, hardware.interconnectBandwidth across nodes (topology.collective_seconds)."""
        p, world = self.profile, self._learner_world(replicas)
        models = 2 if self.algorithm == "ppo" else 1
        nbytes = self.trainable_params * DTYPE_BYTES[self.dtype] * models
        passes = 1 + self.logprob_passes() + (1 if self.gradient_checkpointing else 0)
        weights, grads = zero_collectives(self.zero_stage, self.micro_batches(samples, replicas), passes)
        one = collective_seconds(nbytes, world, self.node_gpus, p.collective_bandwidth, p.interconnect_bandwidth)
        return (weights + grads) * one

    @property
    def node_gpus(self) -> int:
        """Ranks whose collectives run over NVLink: every rank on a cpu host, else one learner pod's (a pod is
        at most a node; NCCL sees two pods, even on one node, as two hosts and goes over the network)."""
        if self.profile.shared_host:
            return 1 << 30
        return max(1, min(self.gpus_per_node, self.ranks_per_pod or self.learner_gpus))

    def learner_nodes(self, replicas: int) -> int:
        return 1 if self.profile.shared_host else nodes_of(self._learner_world(replicas), self.node_gpus)

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

    @property
    def transfer_backend(self) -> str:
        """How weights reach the engines (placement.transfer_backend): nccl or ipc on GPUs, gloo or shm on cpu."""
        return transfer_backend(self.profile.name, self.placement)

    def offload_seconds(self, replicas: int) -> float:
        """Colocated on GPUs, in the train phase: the learner reloads its offloaded states before training and
        offloads them after (DeepSpeed reload_states / offload_states), each way over the host link. The
        engine sleeps at level 2, its weights discarded (the update replaces them), so it copies nothing."""
        if self.placement != "colocated" or self.profile.shared_host:
            return 0.0
        if self.lora_params and not self.lora_merged_sync:
            # LoRA: the engine's base must survive its sleep (level 1: to host memory and back), and the
            # learner's frozen base leaves the GPU with its states while the engine generates.
            return 2.0 * (self.learner_memory(replicas) + self.weight_bytes) / self.profile.host_bandwidth
        return 2.0 * self.learner_memory(replicas) / self.profile.host_bandwidth

    def gather_seconds(self, learner: int) -> float:
        """ZeRO-3: the weights gathered from the ranks' shards before they are sent, one bucket at a time
        (the whole model once, not overlapped with the send)."""
        if self.zero_stage < 3:
            return 0.0
        p = self.profile
        return collective_seconds(self.weight_bytes, self._learner_world(learner), self.node_gpus,
                                  p.collective_bandwidth, p.interconnect_bandwidth)

    def sync_seconds(self, rollout: int = 1, learner: int = 1) -> float:
        """New weights into every engine by the transfer backend, after the ZeRO-3 gather. nccl / gloo
        (disaggregated): a pipelined broadcast from learner rank 0, W over its link whatever the replica count.
        ipc / shm (colocated): every pod's engine wakes and copies the weights from its own learner ranks'
        bucket on the device (or host memory), none over the network."""
        p, w = self.profile, self.sync_bytes
        gather = self.gather_seconds(learner)
        if self.transfer_backend in ("ipc", "shm"):
            wake = 0.0 if p.shared_host else WAKE_KV_SECONDS
            return wake + gather + handover_seconds(w, p.memory_bandwidth * p.bandwidth_efficiency) + p.sync_latency_s
        return gather + broadcast_seconds(w, p.interconnect_bandwidth, p.sync_latency_s, rollout)

    def transfer_bytes(self, rollout: int) -> tuple[float, float]:
        """(bytes out of the learner over the network, bytes copied on the device) of one publish: nccl/gloo
        send W once (a broadcast), ipc/shm copy W on each pod's device (or host) and send nothing."""
        if self.transfer_backend in ("ipc", "shm"):
            return 0.0, self.sync_bytes
        return self.sync_bytes, 0.0

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
        models = 2 if self.algorithm == "ppo" else 1
        if self.lora_params:  # the frozen base (the critic's body too) + the adapters' training state
            total = (w * self.shape.params + per_param * self.lora_params) * models
            return total * (world if self.profile.shared_host else 1)  # the reference is the base: no copy
        total = per_param * self.shape.params * models
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
        return self.tensor_parallel_infeasible() or self.learner_infeasible(learner) or self.rollout_infeasible(rollout)

    def learner_infeasible(self, learner: int) -> str | None:
        """While training: state + activations within a GPU's usable memory (colocated: beside the sleeping
        engine's context); colocated, while generating: generate_phase_infeasible. On cpu the host's state."""
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
        colocated = self.placement == "colocated"
        asleep = p.engine_overhead_bytes if colocated else 0.0  # a sleeping engine keeps its context and graphs
        if states + acts + asleep > limit:
            engine = f" + {asleep / gb:.0f} GB of the sleeping engine" if asleep else ""
            more = ("lower task.maxNewTokens, raise budget.gpus (more learner GPUs to shard over), "
                    "or set placement: disaggregated" if colocated else
                    "raise learner.gpusPerReplica, or allow more learner replicas (learner.maxReplicas, budget.gpus)")
            return (f"learner.replicas: {learner} learner replica(s) need {states / gb:.0f} GB of training state "
                    f"+ {acts / gb:.1f} GB of activations (one sequence){engine} per GPU, above {limit / gb:.0f} GB "
                    f"usable; {zero}{ckpt}{more}")
        return self.generate_phase_infeasible(learner) if colocated else None

    def resident_after_offload(self, learner: int) -> float:
        """Training state that stays on each GPU after the colocated learner offloads: at ZeRO-3 DeepSpeed moves
        the fp32 master weights and Adam's moments only for its FusedAdam, and the learner steps with torch's
        AdamW, so those stay (trainer/transfer/ranks.py offloadable); below ZeRO-3 everything goes."""
        if self.zero_stage < 3:
            return 0.0
        opt = 8.0 if self.dtype == "float32" else 12.0
        return opt * self.shape.params * (2 if self.algorithm == "ppo" else 1) / self._learner_world(learner)

    def update_bytes(self) -> float:
        """What a weight update adds on each engine GPU: one transfer bucket (the receive buffer) and one layer's
        shard, which vLLM's layerwise reload materialises while it processes the layer (bench/weight_sync.py:
        the receive buffers peak at one bucket; the process's peak RSS rose 1.0-1.8 buckets per update on CPU)."""
        if self.sync_bytes < self.weight_bytes:  # an adapter: one bucket at most, into the LoRA slot
            return min(float(TRANSFER_BUCKET_BYTES), self.sync_bytes)
        layer = self.weight_bytes / max(1, self.shape.layers) / max(1, self.rollout_gpus)
        return TRANSFER_BUCKET_BYTES + layer

    def generate_phase_infeasible(self, learner: int = 1) -> str | None:
        """Colocated, while the engine generates: the learner's states are offloaded (its context and what
        DeepSpeed keeps, resident_after_offload, remain) and the engine holds its share of the card plus a weight
        update's extra (update_bytes): u M + update + context + resident <= M."""
        p, gb = self.profile, 1e9
        engine = p.memory * self.rollout_utilization
        update = self.update_bytes() + self.resident_after_offload(learner)
        need = engine + update + LEARNER_CONTEXT_BYTES
        if need <= p.memory:
            return None
        top = (p.memory - update - LEARNER_CONTEXT_BYTES) / p.memory
        return (f"rollout.gpuMemoryUtilization: {self.rollout_utilization:.2g} (colocated) gives the engine "
                f"{engine / gb:.0f} GB of each GPU, which with {update / gb:.1f} GB of a weight update (a transfer "
                f"bucket and a layer) and the learner's states DeepSpeed keeps, and the offloaded learner's "
                f"{LEARNER_CONTEXT_BYTES / gb:.0f} GB context "
                f"exceeds its {p.memory / gb:.0f} GB; lower it to at most {math.floor(top * 100) / 100:.2f}, "
                "or set placement: disaggregated")

    def tensor_parallel_for_group(self) -> int | None:
        """The fewest GPUs per engine that hold the weights and one group's KV cache and that vLLM can shard
        the attention over, or None."""
        p = self.profile
        need = self.group_size * (self.prompt_tokens + self.max_new_tokens) * self.kv_bytes
        per_gpu = p.memory * self.rollout_utilization - p.engine_overhead_bytes
        weights = self.engine_weight_bytes
        return next((t for t in TP_DEGREES if per_gpu * t - weights >= need and self.shape.splits_over(t)), None)

    def tensor_parallel_infeasible(self) -> str | None:
        """vLLM shards the attention heads over the engine's GPUs: a degree that does not divide them cannot
        start. Colocated, the engine spans its learner pod, so the fix is the pod's GPUs."""
        t, sh = self.rollout_gpus, self.shape
        if self.profile.shared_host or sh.splits_over(t):
            return None
        fits = [d for d in TP_DEGREES if d < t and sh.splits_over(d)]
        what = (f"tensor parallelism {t}, and vLLM needs it to divide the model's {sh.attention_heads} attention "
                f"heads ({sh.kv_heads} KV heads)")
        if self.placement == "colocated":
            return (f"learner.gpusPerReplica: {t} GPUs a learner pod give its colocated engine {what}; set "
                    f"learner.gpusPerReplica: {fits[-1] if fits else 1} (more learner pods, one engine each), "
                    "or set placement: disaggregated")
        return f"rollout.gpusPerReplica: {t}: {what}; use {fits[-1] if fits else 1}"

    def rollout_infeasible(self, rollout: int) -> str | None:
        """The engine (its share of memory less overhead) must hold the weights and the KV cache of one
        prompt group at full length: a group is the unit a replica decodes together."""
        gb, cmax = 1e9, self.prompt_tokens + self.max_new_tokens
        _, _, mem = self.rollout_device(rollout)
        need = self.group_size * cmax * self.kv_bytes
        weights = self.engine_weight_bytes
        if mem - weights >= need:
            return None
        what = (f"{weights / gb:.1f} GB of weights leave {max(0.0, mem - weights) / gb:.1f} GB "
                f"of KV cache in {mem / gb:.1f} GB usable (gpuMemoryUtilization {self.rollout_utilization:.2g}, less "
                f"{self.profile.engine_overhead_bytes / gb:.0f} GB engine overhead a GPU), below one group's "
                f"{self.group_size} sequences x {cmax:.0f} tokens ({need / gb:.1f} GB)")
        if self.profile.shared_host:
            return f"hardware.memory: {what}; use a smaller model or set hardware.memory"
        t = self.tensor_parallel_for_group()
        if self.placement == "colocated":
            fix = (f"set learner.gpusPerReplica: {t} (a colocated engine spans its learner pod's GPUs), "
                   if t else "") + ("lower batch.samplesPerPrompt (fewer samples a group), raise "
                                    "rollout.gpuMemoryUtilization, or set placement: disaggregated")
            return f"learner.gpusPerReplica: {self.rollout_gpus} GPU(s) per colocated engine: {what}; {fix}"
        fix = f"set rollout.gpusPerReplica: {t} (tensor parallelism)" if t else "use a smaller model"
        return f"rollout.gpusPerReplica: {self.rollout_gpus} GPU(s) per replica: {what}; {fix}"
