"""The planner's corrected terms against numbers computed by hand (docs/planner.md, section 1): the longest
response of a batch, the ZeRO collectives over NVLink and between nodes, the transfer backend's sync, the HF
activation bytes, the colocated memory in both phases, the learner's offload, max_num_seqs, the default
learner topology, the images rule and the idle-GPU rule."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from rlscale.plan import PlanError, make_plan
from rlscale.plan.choices import using_the_budget
from rlscale.plan.decision import system_model
from rlscale.plan.placement import (
    TRANSFER_BUCKET_BYTES,
    WAKE_KV_SECONDS,
    colocated_unavailable,
    layout_model,
    placements_for,
)
from rlscale.plan.throughput import ACTIVATION_BYTES_PER_HIDDEN
from rlscale.plan.topology import (
    collective_seconds,
    expected_longest,
    response_scale,
    zero_collectives,
)
from rlscale.spec import parse_spec

P7 = 7_615_616_512  # Qwen2.5-7B's published parameter count
W7 = 2 * P7  # bf16 bytes: 15.23 GB


def spec7b(gpus: int, **extra) -> object:
    d = {"model": {"path": "Qwen/Qwen2.5-7B-Instruct", "maxLength": 2048},
         "task": {"maxNewTokens": 1024, "expectedPromptTokens": 256, "expectedResponseTokens": 512},
         "batch": {"samplesPerPrompt": 8, "microBatch": 8}, "budget": {"gpus": gpus},
         "hardware": {"accelerator": "H100"}}
    for key, value in extra.items():
        d[key] = {**d.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_spec(d)


# --------------------------------------------------------------------------- the longest response


def test_expected_longest_by_hand():
    # one response: the mean
    assert expected_longest(300, 1000, 1) == pytest.approx(300)
    # mu = 1000 cut at 1000 ln 2: U = F(cap) = 1/2 and the mean is mu U = 500; then
    # E[max of 2] = mu (U + U^2 / 2) = 1000 (0.5 + 0.125) = 625, of 3: + 1000 * 0.125 / 3 = 666.67
    cap = 1000 * math.log(2)
    assert response_scale(500, cap) == pytest.approx(1000, rel=1e-6)
    assert expected_longest(500, cap, 2) == pytest.approx(625, rel=1e-6)
    assert expected_longest(500, cap, 3) == pytest.approx(1000 * (0.5 + 0.125 + 0.125 / 3), rel=1e-6)
    # no cap to speak of: mu H_n, 512 * (1 + 1/2 + 1/3 + 1/4) = 1066.7
    assert expected_longest(512, 1e12, 4) == pytest.approx(512 * 25 / 12, rel=1e-6)
    # a batch of 1024 responses averaging 512 of at most 1024 almost surely holds one near the cap
    assert 1000 < expected_longest(512, 1024, 1024) <= 1024


def test_generation_waits_for_the_longest_response_of_the_whole_batch():
    m = system_model(spec7b(16, learner={"gpusPerReplica": 1}))
    # 8 prompts x 8 on one replica, all in flight at once: iterations = E[max of 64], not the mean 512
    one = m.generation(8, 8, 1)
    # 16 prompts on two replicas: each runs 64, but the step waits for the longest of all 128
    two = m.generation(16, 8, 2)
    longest64, longest128 = expected_longest(512, 1024, 64), expected_longest(512, 1024, 128)
    assert longest128 > longest64 > 512
    per_iteration = (one.seconds - m.profile.generate_overhead_s) / longest64  # prefill is ~1 ms of it
    assert two.seconds - m.profile.generate_overhead_s == pytest.approx(per_iteration * longest128, rel=0.01)


# --------------------------------------------------------------------------- ZeRO collectives


def test_collective_runs_at_its_slowest_link():
    # 16 GB over 8 ranks of one node: each moves 7/8 of it over NVLink's 300 GB/s
    assert collective_seconds(16e9, 8, 8, 300e9, 25e9) == pytest.approx(7 / 8 * 16e9 / 300e9)
    # 16 ranks on two nodes: 15/16 of it over the 25 GB/s link between them
    assert collective_seconds(16e9, 16, 8, 300e9, 25e9) == pytest.approx(15 / 16 * 16e9 / 25e9)
    assert collective_seconds(16e9, 1, 8, 300e9, 25e9) == 0.0


def test_zero_collectives_by_stage():
    # 4 micro-batches, 2 forward passes each (training's and the old-policy log-probs)
    assert zero_collectives(3, 4, 2) == (4 * (2 + 1), 4)  # a gather per pass + the backward's; a reduce-scatter
    assert zero_collectives(2, 4, 2) == (1, 4)  # a reduce-scatter per backward, one gather of the new weights
    assert zero_collectives(1, 4, 2) == (0, 2)  # one all-reduce at the step's end
    assert zero_collectives(0, 4, 2) == (0, 2)


def test_zero3_across_two_nodes_gathers_the_weights_over_the_link():
    spec = spec7b(16, learner={"zeroStage": 3})  # two 8-GPU pods: 16 ranks on two nodes
    m = layout_model(system_model(spec), spec, "disaggregated")
    # 512 samples / (8 a micro-batch x 16 ranks) = 4 micro-batches a rank; the forward (one mini-batch: no
    # pi_old recompute) and the backward gather 8 times, 4 reduce-scatters: 12 collectives of 15/16 W over 25 GB/s
    assert m.micro_batches(512, 2) == 4
    assert m.collective_seconds(512, 2) == pytest.approx(12 * 15 / 16 * W7 / 25e9)  # 6.85 s
    # ZeRO-1 in the same layout: one all-reduce, 2 x 15/16 W / 25 GB/s = 1.14 s
    z1 = layout_model(system_model(spec7b(16, learner={"zeroStage": 1})), spec, "disaggregated")
    assert z1.collective_seconds(512, 2) == pytest.approx(2 * 15 / 16 * W7 / 25e9)
    # one node: the same ZeRO-3 over NVLink, 7/8 W / 300 GB/s each (1 pod, 8 micro-batches a rank: 24)
    one = layout_model(system_model(spec7b(8, learner={"zeroStage": 3, "gpusPerReplica": 8})), spec, "colocated")
    assert one.collective_seconds(512, 1) == pytest.approx(24 * 7 / 8 * W7 / 300e9)


def test_the_plan_names_a_faster_zero_stage_across_pods():
    p = make_plan(spec7b(16, learner={"zeroStage": 3, "gpusPerReplica": 4}))
    assert p.zero_stage == 3 and p.placement == "colocated"
    assert p.learner_topology.startswith("4 pod(s) x 4 GPUs, ZeRO-3 over 16 ranks")
    assert "across 4 pods over the network" in p.learner_topology
    # a stage that does not gather the weights for every pass over every micro-batch
    assert int(p.learner_topology.rsplit("set learner.zeroStage: ", 1)[1]) < 3
    one_pod = make_plan(spec7b(16, learner={"zeroStage": 1}))  # one 8-GPU learner pod + 8 engines
    assert one_pod.learner_topology.startswith("1 pod(s) x 8 GPUs, ZeRO-1 over 8 ranks")
    assert "inside one pod's NVLink" in one_pod.learner_topology


def test_tensor_parallelism_must_divide_the_attention_heads():
    # Qwen2.5-7B: 28 heads, 4 KV heads; vLLM shards them over TP: 1, 2, 4 do, 8 does not
    shape = system_model(spec7b(16)).shape
    assert (shape.attention_heads, shape.kv_heads) == (28, 4)
    assert [t for t in (1, 2, 4, 8) if shape.splits_over(t)] == [1, 2, 4]
    # a colocated engine spans its 8-GPU learner pod: refused, naming the pod size that works
    with pytest.raises(PlanError, match=r"^spec\.learner\.gpusPerReplica: 8 GPUs a learner pod give its colocated "
                                        r"engine tensor parallelism 8, .* 28 attention heads .*set "
                                        r"learner\.gpusPerReplica: 4"):
        make_plan(spec7b(8, learner={"gpusPerReplica": 8}))
    with pytest.raises(PlanError, match=r"^spec\.rollout\.gpusPerReplica: 8: .*; use 4"):
        make_plan(spec7b(16, placement="disaggregated", rollout={"gpusPerReplica": 8}, learner={"gpusPerReplica": 4}))


# --------------------------------------------------------------------------- transfer backend, memory


def test_transfer_backend_by_accelerator_and_placement():
    spec = spec7b(16)
    base = system_model(spec)
    assert layout_model(base, spec, "disaggregated").transfer_backend == "nccl"
    assert layout_model(base, spec, "colocated").transfer_backend == "ipc"
    cpu = parse_spec({"hardware": {"accelerator": "cpu"}})
    base = system_model(cpu)
    assert layout_model(base, cpu, "disaggregated").transfer_backend == "gloo"
    shm = layout_model(base, cpu, "colocated")
    assert shm.transfer_backend == "shm"
    # shared memory on the host: a copy at 75% of the cpu profile's 20 GB/s, no wake, and its latency (0.105 s,
    # fitted to the default sweep's measured sync)
    w = shm.weight_bytes
    assert shm.sync_seconds(1, 1) == pytest.approx(2 * w / (20e9 * 0.75) + 0.105)


def test_activation_bytes_per_token_hf_qwen2():
    m = system_model(spec7b(8))
    # bf16: ACTIVATION_BYTES_PER_HIDDEN h bytes a layer (measured by bench/learner_memory.py --per-layer) x 28
    # layers, plus the fp32 log-softmax row over the 152,064-token vocabulary
    assert m.activation_bytes_per_token() == pytest.approx(ACTIVATION_BYTES_PER_HIDDEN * 3584 * 28 + 4 * 152_064)
    assert ACTIVATION_BYTES_PER_HIDDEN > 2 * 30  # HF keeps about twice GPT's 34 h (Korthikanti et al.)


def test_colocated_memory_in_both_phases_by_hand():
    spec = spec7b(8, placement="colocated", learner={"zeroStage": 3, "gpusPerReplica": 8})
    m = layout_model(system_model(spec), spec, "colocated")
    # train: ZeRO-3 over 8 ranks, 16 bytes a parameter / 8 = 2 P = 15.23 GB, + one sequence's activations,
    # + the sleeping engine's 2 GB, within 0.9 x 80 GB
    states = 16 * P7 / 8
    assert m.learner_memory(1) == pytest.approx(states)
    acts = 1280 * m.activation_bytes_per_token()
    assert states + acts + 2e9 < 72e9 and m.learner_infeasible(1) is None
    # generate: 0.5 x 80 GB + an update's 512 MiB bucket and one layer's shard (W/28/8 = 68 MB, which vLLM's
    # layerwise reload materialises) + the 1 GB context = 41.6 GB within the 80 GB card
    assert TRANSFER_BUCKET_BYTES == 536_870_912
    assert m.update_bytes() == pytest.approx(536_870_912 + W7 / 28 / 8)
    # at ZeRO-3 the fp32 master weights and Adam's m and v stay on the GPU (torch's AdamW, which DeepSpeed's
    # offload_states will not move): 12 bytes a parameter over 8 ranks = 11.4 GB; below ZeRO-3 nothing stays
    assert m.resident_after_offload(1) == pytest.approx(12 * P7 / 8)
    z1 = layout_model(system_model(spec7b(8, placement="colocated", learner={"gpusPerReplica": 8})), spec, "colocated")
    assert z1.resident_after_offload(1) == 0.0
    assert m.generate_phase_infeasible(1) is None  # 40 + 0.6 + 11.4 + 1 = 53 GB within 80
    # the largest share that fits, 4-GPU pods (the default on 8): (80e9 - 536,870,912 - W/28/4 - 1e9) / 80e9
    # = 0.9791 -> "at most 0.97"
    big_spec = spec7b(8, placement="colocated", rollout={"gpuMemoryUtilization": 0.99})
    big = layout_model(system_model(big_spec), big_spec, "colocated")
    assert "lower it to at most 0.97" in big.generate_phase_infeasible()
    # the learner's states go to the host and back each step: 2 x 15.23 GB / 25 GB/s = 1.22 s of train
    assert m.offload_seconds(1) == pytest.approx(2 * states / 25e9)
    # and the sync: the engine wakes, the gather (7/8 W over NVLink), the IPC copy, the latency
    assert m.sync_seconds(1, 1) == pytest.approx(WAKE_KV_SECONDS + 7 / 8 * W7 / 300e9 + 2 * W7 / (3.35e12 * 0.8) + 0.1)


def test_colocated_refusal_names_what_to_change():
    # two 1-GPU pods of ZeRO-1: 12 / 2 + 4 = 10 bytes a parameter = 76 GB of state a GPU
    with pytest.raises(PlanError) as exc:
        make_plan(spec7b(2, placement="colocated", learner={"gpusPerReplica": 1, "maxReplicas": 2}))
    msg = str(exc.value)
    assert msg.startswith("spec.learner.replicas: 2 learner replica(s) need 76 GB of training state")
    assert "raise budget.gpus" in msg and "set placement: disaggregated" in msg
    assert "spec.lora" in msg  # a frozen base with a LoRA adapter fits: offered as a fix (issue 44)


# --------------------------------------------------------------------------- the plan's choices


def test_default_learner_pod_is_half_the_budget_at_most_a_node():
    assert spec7b(16).learner.gpus_per_replica == 8  # two nodes: one pod per node
    assert spec7b(8).learner.gpus_per_replica == 4  # one node: the other half is the rollout's (or 2 colocated pods)
    assert spec7b(4).learner.gpus_per_replica == 2
    assert spec7b(1).learner.gpus_per_replica == 1  # one GPU: colocated
    assert spec7b(16, hardware={"accelerator": "H100", "gpusPerNode": 4}).learner.gpus_per_replica == 4
    assert spec7b(16, learner={"gpusPerReplica": 2}).learner.gpus_per_replica == 2  # the spec's word
    assert parse_spec({"hardware": {"accelerator": "cpu"}}).learner.gpus_per_replica == 1


def test_colocated_is_offered_only_with_the_charts_learner_image():
    custom = spec7b(16, learner={"image": "me/learner:1", "gpusPerReplica": 4})
    assert "not the chart's default learner image" in colocated_unavailable(custom)
    assert placements_for(custom) == ["disaggregated"]
    p = make_plan(custom)
    assert p.placement == "disaggregated" and p.gpus == 16 and p.transfer_backend == "nccl"
    assert "Placement disaggregated: colocated not offered: learner.image 'me/learner:1'" in p.reason
    # asked for explicitly, colocated is the spec's word
    assert placements_for(spec7b(16, placement="colocated", learner={"image": "me/learner:1"})) == ["colocated"]
    assert colocated_unavailable(spec7b(16)) is None
    # one node with an 8-GPU learner pod and a custom image: nothing fits, and the refusal says why
    with pytest.raises(PlanError, match=r"^spec\.budget\.gpus: 8 .*; colocated: not offered: learner\.image"):
        make_plan(spec7b(8, learner={"image": "me/learner:1", "gpusPerReplica": 8}))


def test_no_budgeted_gpu_stays_idle_when_a_split_uses_them_all():
    c = [SimpleNamespace(gpus=g) for g in (8, 12, 16, 16)]
    assert using_the_budget(c, 16) == c[2:]
    assert using_the_budget(c[:2], 16) == [c[1]]  # none uses all 16: the most any uses
    cpu = [SimpleNamespace(gpus=0)]
    assert using_the_budget(cpu, 8) == cpu
    # on 16 GPUs with 1-GPU learner pods (at most 8), colocated can use only 8: disaggregated, all 16
    p = make_plan(spec7b(16, learner={"gpusPerReplica": 1, "zeroStage": 3}))
    assert p.gpus == 16 and p.placement == "disaggregated"
    assert "colocated not chosen: it uses at most 8 of budget.gpus (16)" in p.reason


def test_max_num_seqs_is_the_plans_concurrency_and_the_engine_takes_it():
    from rlscale.runconfig import RunConfig
    from rlscale.trainer.run_env import rollout_engine_config

    spec = spec7b(8, learner={"gpusPerReplica": 4})
    p = make_plan(spec)
    # the step's sequences in flight per replica, or the evals' 500 prompts over the replicas when more
    m = layout_model(system_model(spec), spec, p.placement)
    evals = m.generation(500, 1, p.rollout_replicas).concurrency
    assert p.max_num_seqs == max(p.candidates[0].concurrency, evals) > 0
    assert p.to_dict()["maxNumSeqs"] == p.max_num_seqs
    cfg = RunConfig(run="r", spec=spec, plan=p, model_dir="/m", seed=1)
    assert rollout_engine_config(cfg).max_num_seqs == p.max_num_seqs


def test_the_new_plan_fields_round_trip_and_old_plans_load():
    from rlscale.plan.decision import Plan

    p = make_plan(spec7b(16))
    d = p.to_dict(candidates=False)
    back = Plan.from_dict(d)
    assert (back.zero_stage, back.learner_topology, back.transfer_backend, back.max_num_seqs) == (
        p.zero_stage, p.learner_topology, p.transfer_backend, p.max_num_seqs)
    for key in ("zeroStage", "learnerTopology", "transferBackend", "maxNumSeqs"):
        d.pop(key)
    old = Plan.from_dict(d)  # a status.plan written before these keys
    assert (old.zero_stage, old.learner_topology, old.transfer_backend, old.max_num_seqs) == (1, "", "", 0)


def test_max_num_seqs_is_capped_and_left_to_vllm_on_cpu():
    from rlscale.plan.throughput import MAX_NUM_SEQS

    # a 0.5B model's KV cache holds thousands of sequences on an H100; the engine is planned at 1024
    small = parse_spec({"model": {"path": "Qwen/Qwen2.5-0.5B", "maxLength": 1024},
                        "task": {"maxNewTokens": 256, "expectedPromptTokens": 128, "expectedResponseTokens": 128},
                        "batch": {"samplesPerPrompt": 16, "prompts": 512, "minPrompts": 512, "maxPrompts": 512},
                        "budget": {"gpus": 2}, "placement": "disaggregated",
                        "learner": {"gpusPerReplica": 1}, "rollout": {"replicas": 1},
                        "hardware": {"accelerator": "H100"}})
    m = layout_model(system_model(small), small, "disaggregated")
    assert m.generation(512, 16, 1).concurrency == MAX_NUM_SEQS == 1024
    assert make_plan(small).max_num_seqs == 1024
    # cpu: the stand-in engine keeps vLLM's default
    assert make_plan(parse_spec({"hardware": {"accelerator": "cpu"}})).max_num_seqs == 0
