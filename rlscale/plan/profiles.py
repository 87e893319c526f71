"""Accelerator profiles: datasheet bandwidth, FLOP/s and memory, plus how much of them real runs get."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rlscale.plan.errors import PlanError

GB = 1e9
TB = 1e12


@dataclass(frozen=True)
class AcceleratorProfile:
    """One device (or, for cpu, one whole machine) as the planner sees it."""

    name: str
    memory_bandwidth: float  # bytes/s, datasheet
    flops_bf16: float  # dense FLOP/s in bf16/fp16 (tensor cores where there are any)
    flops_fp32: float  # dense FLOP/s in fp32 as PyTorch runs it by default (no TF32)
    memory: float  # bytes per device
    interconnect_bandwidth: float  # bytes/s learner -> rollout for weight sync
    collective_bandwidth: float  # bytes/s bus bandwidth of a gradient all-reduce between learner ranks
    # Usable fractions: decode kernels reach ~70-85% of HBM bandwidth; prefill and decode
    # matmuls reach about half of peak; RL learners report 30-40% MFU.
    bandwidth_efficiency: float = 0.8
    decode_flops_efficiency: float = 0.5
    train_mfu: float = 0.35
    memory_utilization: float = 0.9  # vLLM's gpu_memory_utilization default
    decode_iteration_overhead_s: float = 1.5e-3  # scheduler + launch per decode iteration
    micro_batch_overhead_s: float = 5e-3  # per learner forward/backward call
    # A learner step's fixed cost beside its compute, micro-batch calls and optimizer traffic: on cpu the default
    # sweep's train seconds, linear in the batch, meet zero samples at about 50 ms (bench/fit_cpu_profile.py);
    # 0 where it is not measured.
    train_step_overhead_s: float = 0.0
    sync_latency_s: float = 0.1  # fixed cost of a weight publish (handshake, reload)
    generate_overhead_s: float = 0.02  # fixed cost of a step's generation call: the Serve round trip
    # vLLM's prefix cache shares whole KV blocks of a prompt only (never its last token): a group's samples
    # each prefill the rest. vLLM's default block: 16 tokens on GPUs, 128 on its CPU backend.
    kv_block_tokens: int = 16
    reward_seconds_per_sample: float = 2e-5  # builtin verifiable rewards in Python
    shared_host: bool = False  # cpu: every replica shares the same cores and memory
    # A shared host's phase on a share s of its cores takes f + (1 - f) / s of its seconds on all of them
    # (Amdahl): f is the part more cores do not shorten. `rlscale run` splits the cores when it generates
    # ahead (rlscale/cpu_split.py), so each side runs on its share.
    core_serial_fraction: float = 0.0
    # What an engine holds beside weights and KV cache on each GPU: the activation peak of a
    # prefill chunk, CUDA graphs, NCCL and cuBLAS workspaces (vLLM's profile run reserves it).
    engine_overhead_bytes: float = 2 * GB
    # Host <-> device copies of a sleeping engine's weights: ~25 GB/s a GPU over PCIe (pinned Gen4/Gen5
    # copies as measured in practice; a Gen5 x16 link peaks at 64).
    host_bandwidth: float = 25 * GB

    def flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for the model dtype."""
        return self.flops_fp32 if dtype == "float32" else self.flops_bf16


# Sources (datasheets; checked against the vendors' published tables):
# - H100 SXM5 80GB: NVIDIA H100 Tensor Core GPU datasheet: 3.35 TB/s HBM3, 989 TFLOP/s
#   dense BF16 (1,979 with sparsity), 67 TFLOP/s FP32, NVLink 900 GB/s. One 400 Gb/s
#   NDR NIC per GPU on a DGX H100 -> 50 GB/s; we assume about half for weight sync.
# - H200 SXM 141GB: NVIDIA H200 datasheet: 4.8 TB/s HBM3e, 141 GB, same compute as H100.
# - A100 80GB SXM: NVIDIA A100 datasheet: 2,039 GB/s HBM2e, 312 TFLOP/s dense BF16,
#   19.5 TFLOP/s FP32, NVLink 600 GB/s; 200 Gb/s HDR NICs.
# - L4: NVIDIA L4 datasheet: 300 GB/s GDDR6, 24 GB, 121 TFLOP/s dense BF16 (242 with
#   sparsity), 30.3 TFLOP/s FP32, PCIe Gen4 x16 (no NVLink); cloud nodes have 50-100 Gb/s.
# - cpu: a 2-core x86 cloud VM; ROUGH numbers measured there, not a datasheet, which
#   calibration from measured steps replaces (docs/measurements.md, "The cpu accelerator profile").
PROFILES: dict[str, AcceleratorProfile] = {
    "H100": AcceleratorProfile(
        name="H100", memory_bandwidth=3.35 * TB, flops_bf16=989e12, flops_fp32=67e12, memory=80 * GB,
        interconnect_bandwidth=25 * GB, collective_bandwidth=300 * GB,
    ),
    "H200": AcceleratorProfile(
        name="H200", memory_bandwidth=4.8 * TB, flops_bf16=989e12, flops_fp32=67e12, memory=141 * GB,
        interconnect_bandwidth=25 * GB, collective_bandwidth=300 * GB,
    ),
    "A100-80GB": AcceleratorProfile(
        name="A100-80GB", memory_bandwidth=2.039 * TB, flops_bf16=312e12, flops_fp32=19.5e12, memory=80 * GB,
        interconnect_bandwidth=12.5 * GB, collective_bandwidth=200 * GB,
    ),
    "L4": AcceleratorProfile(
        name="L4", memory_bandwidth=300 * GB, flops_bf16=121e12, flops_fp32=30.3e12, memory=24 * GB,
        interconnect_bandwidth=6 * GB, collective_bandwidth=12 * GB,
    ),
    "cpu": AcceleratorProfile(
        name="cpu", memory_bandwidth=20 * GB, flops_bf16=190e9, flops_fp32=190e9, memory=24 * GB,
        # Weight sync and the generation overhead: docs/measurements.md, "The cpu accelerator profile".
        interconnect_bandwidth=2 * GB, collective_bandwidth=5 * GB,
        # decode_flops_efficiency, decode_iteration_overhead_s, train_mfu, train_step_overhead_s, sync_latency_s and
        # reward_seconds_per_sample: least squares over the quickstart's default sweep (8, 16, 32 and 64 prompts x 8
        # and one 500-prompt eval; the data and the command that measured them: tests/plan/data/
        # cpu_quickstart_measured.json) by `python bench/fit_cpu_profile.py`, which prints each batch's residuals
        # (generate within 12%, train 5%, sync 3%, the step 7%). The fit before, to 32x8 alone on a faster day
        # (0.5, 28 ms, train_mfu 0.84, no fixed train cost, sync 50 ms), predicted 364 samples/s there against
        # the sweep's 245. Every generation decodes about 4 iterations, so the per-iteration overhead and the
        # fixed generate_overhead_s are one constant in these data: the fit keeps the latter, measured apart.
        bandwidth_efficiency=0.75, decode_flops_efficiency=0.31, train_mfu=0.60, memory_utilization=0.8,
        decode_iteration_overhead_s=1.37e-4, micro_batch_overhead_s=0.01, train_step_overhead_s=0.052,
        sync_latency_s=0.105, generate_overhead_s=0.065, reward_seconds_per_sample=1.5e-5, kv_block_tokens=128,
        shared_host=True, engine_overhead_bytes=0.0, host_bandwidth=20 * GB,
        # The quickstart at 32x8 on one core of two against both: generate 0.37 s vs 0.27 s (x1.37, f 0.63),
        # train 0.58 s vs 0.38 s (x1.53, f 0.47): the phases table of docs/examples/quickstart-staleness-sweep/
        # sweep.md (`rlscale sweep` of its quickstart-staleness.yaml with --staleness 0,1,2).
        core_serial_fraction=0.5,
    ),
}


def accelerator_profile(hardware: Any, dtype: str | None = None) -> AcceleratorProfile:
    """The profile for spec.hardware (or an accelerator name), with the spec's explicit numbers applied."""
    name = hardware if isinstance(hardware, str) else hardware.accelerator
    base = PROFILES.get(name)
    if base is None:
        raise PlanError(f"spec.hardware.accelerator: {name!r} has no profile; use one of {', '.join(PROFILES)}")
    if isinstance(hardware, str):
        return base
    changes: dict[str, float] = {}
    if hardware.memory_bandwidth:
        changes["memory_bandwidth"] = hardware.memory_bandwidth
    if hardware.peak_flops:
        # the spec gives peak FLOP/s in the model dtype: apply it to that dtype's entry
        key = "flops_fp32" if dtype == "float32" else "flops_bf16"
        changes[key] = hardware.peak_flops
        if dtype is None:
            changes["flops_fp32"] = hardware.peak_flops
    if hardware.memory:
        changes["memory"] = hardware.memory
    if hardware.interconnect_bandwidth:
        changes["interconnect_bandwidth"] = hardware.interconnect_bandwidth
    return replace(base, **changes) if changes else base
