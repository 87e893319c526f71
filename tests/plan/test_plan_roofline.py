"""The decode roofline, KV cap and phase model against numbers computed by hand."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from rlscale.plan import accelerator_profile, model_shape_for
from rlscale.plan.shapes import ModelShape
from rlscale.plan.throughput import (
    SystemModel,
    crossover_concurrency,
    decode_step_seconds,
    max_concurrency,
)
from rlscale.plan.topology import expected_longest
from rlscale.spec import parse_spec

QWEN7B_PARAMS = 7_615_616_512  # published total of Qwen2.5-7B
W = QWEN7B_PARAMS * 2  # bf16 weight bytes: 15.23 GB
BW, F = 3.35e12, 989e12  # H100 SXM datasheet: HBM3 bytes/s, dense bf16 FLOP/s


@pytest.fixture
def qwen7b() -> ModelShape:
    return model_shape_for(parse_spec({"model": {"path": "Qwen/Qwen2.5-7B"}}))


def test_kv_bytes_per_token_qwen7b(qwen7b):
    # 2 (K and V) x 28 layers x 4 kv heads x 128 head dim x 2 bytes
    assert qwen7b.kv_bytes_per_token("bfloat16") == 2 * 28 * 4 * 128 * 2 == 57_344
    assert qwen7b.weight_bytes("bfloat16") == W


def test_single_sequence_is_weight_read_bound():
    t = decode_step_seconds(1, W, 0.0, 0.0, BW, F, QWEN7B_PARAMS)
    assert t == pytest.approx(15_231_232_024 / 3.35e12)  # 4.547 ms
    assert t == pytest.approx(4.5466e-3, rel=1e-4)
    assert 1 / t == pytest.approx(219.9, rel=1e-3)  # tokens/s at b=1


def test_b256_still_memory_bound_ignoring_kv():
    t = decode_step_seconds(256, W, 0.0, 0.0, BW, F, QWEN7B_PARAMS)
    compute = 2 * QWEN7B_PARAMS * 256 / F  # 3.943 ms, below the 4.547 ms weight read
    assert compute == pytest.approx(3.9425e-3, rel=1e-4)
    assert t == pytest.approx(W / BW)
    assert 256 / t == pytest.approx(56_305, rel=1e-3)  # 256x the b=1 throughput, for free


def test_crossover_near_295_on_h100_and_206_on_h200():
    b_star = crossover_concurrency(F, BW, 2)
    assert b_star == pytest.approx(295.2, abs=0.1)
    assert crossover_concurrency(F, 4.8e12, 2) == pytest.approx(206.0, abs=0.1)
    below = decode_step_seconds(295, W, 0.0, 0.0, BW, F, QWEN7B_PARAMS)
    above = decode_step_seconds(296, W, 0.0, 0.0, BW, F, QWEN7B_PARAMS)
    assert below == pytest.approx(W / BW)  # memory term still the max
    assert above == pytest.approx(2 * QWEN7B_PARAMS * 296 / F)  # compute term took over
    assert above > W / BW


def test_kv_traffic_adds_to_the_memory_term():
    kv, c = 57_344, 768
    t = decode_step_seconds(256, W, kv, c, BW, F, QWEN7B_PARAMS)
    assert t == pytest.approx((W + 256 * 768 * 57_344) / BW)  # (15.23 + 11.27 GB) / 3.35 TB/s
    assert t == pytest.approx(7.912e-3, rel=1e-3)


def test_kv_cap_h100_qwen7b():
    # (80 GB x 0.9 - 15.23 GB) / (2048 tokens x 57,344 bytes) = 483.4 sequences
    cap = max_concurrency(80e9 * 0.9, W, 57_344, 2048)
    assert cap == 483
    assert max_concurrency(10e9, W, 57_344, 2048) == 0  # weights alone do not fit


def _system(spec_dict) -> SystemModel:
    from rlscale.plan.decision import system_model

    return system_model(parse_spec({"model": {"path": "builtin:tiny-arith"}, **spec_dict}))


GPU_7B = {"model": {"path": "Qwen/Qwen2.5-7B", "maxLength": 2048},
          "task": {"maxNewTokens": 1024, "expectedPromptTokens": 256, "expectedResponseTokens": 512},
          "hardware": {"accelerator": "H100"}, "budget": {"gpus": 16}, "learner": {"gpusPerReplica": 1}}


def test_generation_concurrency_is_capped_by_kv_memory():
    m = _system(GPU_7B)
    bw, fl, mem = m.rollout_device(1)
    cap = max_concurrency(mem, m.weight_bytes, m.kv_bytes, 256 + 1024)
    # vLLM's share of the GPU, less the engine's own overhead (activation peak, CUDA graphs): 2 GB
    assert cap == int((80e9 * 0.9 - 2e9 - W) // (1280 * 57_344))  # 746
    big = m.generation(512, 8, 1)  # 4096 sequences on one replica
    assert big.concurrency == cap
    small = m.generation(8, 8, 1)
    assert small.concurrency == 64
    # past the cap, sequences queue: the step takes ~ n / cap times as many iterations
    assert big.seconds > 4 * small.seconds


def test_generation_below_the_cap_costs_about_the_same_at_any_batch():
    # memory-bound decode: 64 or 128 sequences take nearly the same number of seconds
    m = _system(GPU_7B)
    g64, g128 = m.generation(8, 8, 1), m.generation(16, 8, 1)
    assert g64.bound == g128.bound == "memory"
    assert g128.seconds / g64.seconds < 1.3
    assert g128.tokens_per_second / g64.tokens_per_second > 1.5


def test_generation_hand_computed_one_replica():
    m = _system(GPU_7B)
    p = accelerator_profile("H100")
    bw = 3.35e12 * p.bandwidth_efficiency
    fl = 989e12 * p.decode_flops_efficiency
    n, ctx = 64, 256 + 512 / 2
    t_iter = max((W + n * ctx * 57_344) / bw, 2 * QWEN7B_PARAMS * n / fl)
    # all 64 sequences run at once, so the step lasts as long as the longest of them (test_plan_terms.py
    # checks expected_longest by hand), not the mean's 512 iterations
    decode = expected_longest(512, 1024, 64) * (p.decode_iteration_overhead_s + t_iter)
    # the prefix cache shares a prompt's whole 16-token blocks short of its last token (240 of 256) once per
    # prompt; each of the 64 sequences prefills the other 16
    prefill = 2 * QWEN7B_PARAMS * (8 * 240 + 64 * 16) / fl
    # plus the fixed cost of the call (the Serve round trip), whatever the batch
    assert m.generation(8, 8, 1).seconds == pytest.approx(decode + prefill + p.generate_overhead_s)


@pytest.mark.parametrize(("accelerator", "prompt", "shared"), [
    ("H100", 16, 0), ("H100", 17, 16), ("H100", 256, 240), ("H100", 257, 256),  # 16-token blocks, last token apart
    ("cpu", 7, 0), ("cpu", 128, 0), ("cpu", 300, 256),  # vLLM's CPU blocks are 128 tokens
])
def test_a_group_shares_its_prompt_s_whole_kv_blocks_only(accelerator, prompt, shared):
    m = _system({**GPU_7B, "hardware": {"accelerator": accelerator}})
    m = replace(m, prompt_tokens=float(prompt))
    assert m.shared_prompt_tokens == shared
    # 8 samples of one prompt prefill the shared tokens once instead of 8 times; decoding is the same
    unshared = replace(m, profile=replace(m.profile, kv_block_tokens=1 << 20))
    saved = 2 * m.shape.active * shared * 7 / m.rollout_device(1)[1]
    assert unshared.generation(1, 8, 1).seconds - m.generation(1, 8, 1).seconds == pytest.approx(saved, abs=1e-12)


def test_train_seconds_scale_with_tokens_and_learners():
    m = _system(GPU_7B)
    p = accelerator_profile("H100")
    tokens = 512 * (256 + 512)
    compute = 6 * QWEN7B_PARAMS * tokens / (989e12 * p.train_mfu * 8)  # one mini-batch: no pi_old recompute
    t = m.train_seconds(512, 8)
    # the rest: optimizer, micro-batch overhead and the all-reduce, which crosses the network between the
    # eight 1-GPU pods: 2 x 7/8 x W / 25 GB/s
    assert compute < t < compute * 1.1 + 2 * 7 / 8 * W / 25e9
    # twice the samples: twice the compute; the one all-reduce a step is the same
    coll = m.collective_seconds(512, 8)
    assert coll == pytest.approx(2 * 7 / 8 * W / 25e9)
    assert (m.train_seconds(1024, 8) - coll) / (t - coll) == pytest.approx(2, rel=0.05)
    # half the learners: twice the compute (the all-reduce over the network barely changes: 3/4 vs 7/8 of W)
    four = m.train_seconds(512, 4) - m.collective_seconds(512, 4)
    assert four / (t - m.collective_seconds(512, 8)) == pytest.approx(2, rel=0.1)


def test_reference_model_and_ppo_add_passes():
    grpo = _system(GPU_7B)
    kl = _system({**GPU_7B, "algorithm": {"klCoef": 0.05}})
    ppo = _system({**GPU_7B, "algorithm": {"name": "ppo"}})
    minis = _system({**GPU_7B, "algorithm": {"miniBatches": 2}})
    p = QWEN7B_PARAMS
    # one mini-batch: pi_old comes from the update's own forward (trainer/updates.py), so 6P forward + backward
    assert grpo.train_flops_per_token() == 6 * p
    assert minis.train_flops_per_token() == 8 * p  # two: the second mini-batch's pi_old recomputed before
    assert kl.train_flops_per_token() == 8 * p  # the reference's forward
    assert ppo.train_flops_per_token() == 14 * p  # the critic's training and its value pass


def test_sync_is_bytes_over_link_plus_latency():
    m = _system({**GPU_7B, "hardware": {"accelerator": "H100", "interconnectBandwidth": 5e9}})
    assert m.sync_seconds() == pytest.approx(W / 5e9 + accelerator_profile("H100").sync_latency_s)


def test_cpu_replicas_share_the_host():
    m = _system({"hardware": {"accelerator": "cpu"}, "model": {"dtype": "float32"}})
    one, two = m.generation(16, 8, 1), m.generation(16, 8, 2)
    assert two.seconds >= one.seconds  # two replicas on the same cores: no faster
    assert m.train_seconds(128, 2) >= m.train_seconds(128, 1)


def test_spec_overrides_profile_numbers():
    s = parse_spec({"model": {"path": "builtin:tiny-arith"},
                    "hardware": {"accelerator": "H100", "memoryBandwidth": 1e12, "peakFlops": 5e14, "memory": 40e9}})
    p = accelerator_profile(s.hardware, s.model.dtype)
    assert (p.memory_bandwidth, p.flops("bfloat16"), p.memory) == (1e12, 5e14, 40e9)
    assert p.flops("float32") == 67e12  # the override is for the model dtype only
    assert accelerator_profile("H100").memory_bandwidth == 3.35e12


def test_profiles_cover_every_accelerator_the_spec_allows():
    from rlscale.spec import ACCELERATORS

    for name in ACCELERATORS:
        p = accelerator_profile(name)
        assert p.memory_bandwidth > 0 and p.flops("bfloat16") > 0 and p.memory > 0
        assert math.isfinite(crossover_concurrency(p.flops("bfloat16"), p.memory_bandwidth, 2))
