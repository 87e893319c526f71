"""Placement in the plan: colocated vs disaggregated, the weight-sync term, the engine's memory check, and
plan dicts written before these fields existed."""

from __future__ import annotations

import json

import pytest
import yaml

from rlscale.plan import PlanError, make_plan
from rlscale.plan.decision import Plan, system_model
from rlscale.plan.placement import BROADCAST_HOP_SECONDS, WAKE_KV_SECONDS, layout_model
from rlscale.spec import parse_spec
from tests.conftest import EXAMPLES
from tests.conftest import rlscale_cli as cli

H100_TASK = {"maxNewTokens": 512, "expectedPromptTokens": 128, "expectedResponseTokens": 256}


def gpu_spec(model: str, gpus: int, **extra) -> object:
    d = {"model": {"path": model, "dtype": "bfloat16", "maxLength": 1024}, "task": H100_TASK,
         "budget": {"gpus": gpus}, "hardware": {"accelerator": "H100"}}
    for key, value in extra.items():
        d[key] = {**d.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_spec(d)


def quickstart(**changes) -> object:
    d = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())["spec"]
    d.update(changes)
    return parse_spec(d)


def test_one_h100_plans_colocated_and_says_why():
    p = make_plan(gpu_spec("Qwen/Qwen2.5-1.5B-Instruct", 1))
    assert (p.placement, p.rollout_replicas, p.learner_replicas, p.gpus) == ("colocated", 1, 1, 1)
    assert p.tensor_parallel == 1 and p.ranks_per_pod == 1 and p.rollout_memory_utilization == 0.5
    assert p.transfer_backend == "ipc"
    assert "Placement colocated: disaggregated does not fit (budget.gpus: 1 does not fit one rollout and one " \
           "learner replica (2 GPUs)" in p.reason
    # one pod: the engine wakes (level 2: nothing copied from the host) and takes the weights by IPC, a device
    # copy (read and write) at 80% of 3.35 TB/s, plus the publish's latency
    spec = gpu_spec("Qwen/Qwen2.5-1.5B-Instruct", 1)
    w = system_model(spec).weight_bytes
    assert p.predicted.sync == pytest.approx(WAKE_KV_SECONDS + 2 * w / (3.35e12 * 0.8) + 0.1)
    # the train phase adds the learner's reload + offload of its states (ZeRO-1 on one GPU: 16 bytes a
    # parameter) over 25 GB/s of host link
    apart = layout_model(system_model(spec), spec, "disaggregated")
    params = system_model(spec).shape.params
    assert p.predicted.train - apart.train_seconds(p.batch, 1) == pytest.approx(2 * 16 * params / 25e9)

def test_eight_h100_7b_auto_states_its_choice_in_words():
    # learner pods of 4 GPUs, so both placements can use all 8: 2 pods with engines, or 1 pod + 4 engines
    spec = gpu_spec("Qwen/Qwen2.5-7B-Instruct", 8, learner={"zeroStage": 3, "gpusPerReplica": 4})
    p = make_plan(spec)
    assert p.gpus == 8
    other = "disaggregated" if p.placement == "colocated" else "colocated"
    assert f"Placement {p.placement}: " in p.reason and f"x faster to target than {other}" in p.reason
    assert "generate" in p.reason and "train" in p.reason and "sync" in p.reason
    best_other = min(make_plan(spec, placement=other).candidates, key=lambda c: c.predicted.time_to_target_seconds)
    assert best_other.gpus == 8
    assert p.predicted.time_to_target_seconds <= best_other.predicted.time_to_target_seconds
    if p.placement == "colocated":
        assert p.rollout_replicas == p.learner_replicas and p.gpus == 4 * p.learner_replicas


def test_colocated_that_does_not_fit_names_the_fields():
    # generating: the engine's 0.99 x 80 GB + a 0.54 GB bucket + the learner's 1 GB context > 80 GB
    with pytest.raises(PlanError, match=r"^spec\.rollout\.gpuMemoryUtilization: 0\.99 .*lower it to at most 0\.97, "
                                        r"or set placement: disaggregated"):
        make_plan(gpu_spec("Qwen/Qwen2.5-7B-Instruct", 8, placement="colocated",
                           rollout={"gpuMemoryUtilization": 0.99}, learner={"gpusPerReplica": 4}))
    # training: ZeRO-0 keeps 16 bytes a parameter (122 GB) on every GPU, beside the sleeping engine
    with pytest.raises(PlanError) as exc:
        make_plan(gpu_spec("Qwen/Qwen2.5-7B-Instruct", 8, placement="colocated",
                           learner={"zeroStage": 0, "gpusPerReplica": 4}))
    msg = str(exc.value)
    assert msg.startswith("spec.learner.replicas: 2 learner replica(s) need 122 GB of training state")
    assert "+ 2 GB of the sleeping engine" in msg
    for fix in ("raise learner.zeroStage", "learner.gradientCheckpointing: true", "lower task.maxNewTokens",
                "raise budget.gpus", "set placement: disaggregated"):
        assert fix in msg
    assert "spec.lora" in msg  # a frozen base with a LoRA adapter fits there: offered as a fix (issue 44)
    # the same at ZeRO-1 (5.5 bytes a parameter over 8 ranks) fits: the states are offloaded while generating
    # (in 4-GPU pods: a TP-8 engine could not shard the 7B's 28 attention heads, test_plan_terms.py)
    ok = make_plan(gpu_spec("Qwen/Qwen2.5-7B-Instruct", 8, placement="colocated", learner={"gpusPerReplica": 4}))
    assert ok.placement == "colocated" and ok.rollout_memory_utilization == 0.5

def test_nccl_broadcast_is_flat_in_replicas_after_the_zero3_gather():
    spec = gpu_spec("Qwen/Qwen2.5-7B-Instruct", 16, learner={"zeroStage": 3})  # 8-GPU learner pods
    base = layout_model(system_model(spec), spec, "disaggregated")
    assert base.transfer_backend == "nccl"
    w, ib = base.weight_bytes, base.profile.interconnect_bandwidth
    # one 8-rank pod: the gather runs inside the node at 300 GB/s, each rank receiving 7/8 of the weights
    gather = 7 / 8 * w / 300e9
    bcast = [base.sync_seconds(r, 1) for r in (1, 2, 4, 8)]
    assert bcast[0] == pytest.approx(gather + w / ib + 0.1)
    assert bcast[-1] - bcast[0] == pytest.approx(7 * BROADCAST_HOP_SECONDS)
    assert base.transfer_bytes(8) == (w, 0.0)  # the learner sends the weights once, whatever the replicas

def test_colocated_sync_is_an_ipc_copy_in_every_pod_none_over_the_network():
    spec = gpu_spec("Qwen/Qwen2.5-7B-Instruct", 16, learner={"zeroStage": 3, "gpusPerReplica": 8})
    m = layout_model(system_model(spec), spec, "colocated")
    assert m.rollout_gpus == 8 and m.rollout_utilization == 0.5 and m.transfer_backend == "ipc"
    w = m.weight_bytes
    copy = 2 * w / (3.35e12 * 0.8)
    # one pod: the gather over NVLink (7/8 of W at 300 GB/s), then the device copy
    assert m.sync_seconds(1, 1) == pytest.approx(WAKE_KV_SECONDS + 7 / 8 * w / 300e9 + copy + 0.1)
    # two pods on two nodes: every pod hands its own engine the gathered buckets; the gather crosses the
    # 25 GB/s link between the nodes (15/16 of W)
    assert m.sync_seconds(2, 2) == pytest.approx(WAKE_KV_SECONDS + 15 / 16 * w / 25e9 + copy + 0.1)
    assert m.transfer_bytes(2) == (0.0, w)

def qwen32b(tp: int, **extra) -> object:
    return parse_spec({
        "model": {"path": "Qwen/Qwen2.5-32B", "dtype": "bfloat16", "maxLength": 2048},
        "task": {"maxNewTokens": 1536, "expectedPromptTokens": 512, "expectedResponseTokens": 768},
        "batch": {"samplesPerPrompt": 16, "microBatch": 16}, "budget": {"gpus": 40}, "placement": "disaggregated",
        "rollout": {"gpusPerReplica": tp},
        "learner": {"gpusPerReplica": 8, "maxReplicas": 4, "zeroStage": 3, "gradientCheckpointing": True},
        "hardware": {"accelerator": "H100"}, **extra})


def test_32b_at_tp1_is_refused_naming_the_fix_and_tp2_plans():
    with pytest.raises(PlanError) as exc:
        make_plan(qwen32b(1))
    msg = str(exc.value)
    assert msg.startswith("spec.rollout.gpusPerReplica: 1 GPU(s) per replica: 65.5 GB of weights leave 4.5 GB")
    assert msg.endswith("set rollout.gpusPerReplica: 2 (tensor parallelism)")
    p = make_plan(qwen32b(2))
    assert p.tensor_parallel == 2 and p.placement == "disaggregated"
    assert p.gpus == 2 * p.rollout_replicas + 8 * p.learner_replicas <= 40
    # auto finds the other placement: one engine over each 8-GPU learner pod (TP 8)
    auto = make_plan(qwen32b(1, placement="auto"))
    assert auto.placement == "colocated" and auto.tensor_parallel == 8 and auto.ranks_per_pod == 8
    assert "disaggregated does not fit (rollout.gpusPerReplica: 1" in auto.reason


def test_gradient_checkpointing_shrinks_learner_activations():
    spec = gpu_spec("Qwen/Qwen2.5-7B-Instruct", 8, learner={"zeroStage": 3})
    plain = system_model(spec)
    ckpt = system_model(gpu_spec("Qwen/Qwen2.5-7B-Instruct", 8, learner={"zeroStage": 3,
                                                                        "gradientCheckpointing": True}))
    assert ckpt.activation_bytes_per_token() < plain.activation_bytes_per_token() / 3
    # one mini-batch: 6P, and checkpointing's forward once more: 8P
    assert ckpt.train_flops_per_token() == pytest.approx(plain.train_flops_per_token() * 8 / 6)
    note = plain.activation_note(8)
    assert note is not None and "set batch.microBatchTokens to at most" in note
    fit = int(note.split("at most ")[1].split(" ")[0].replace(",", ""))
    fixed = gpu_spec("Qwen/Qwen2.5-7B-Instruct", 8, learner={"zeroStage": 3}, batch={"microBatchTokens": fit})
    assert system_model(fixed).activation_note(8) is None


def test_plan_dicts_without_the_new_keys_still_load():
    p = make_plan(gpu_spec("Qwen/Qwen2.5-1.5B-Instruct", 1))
    d = json.loads(json.dumps(p.to_dict()))
    assert Plan.from_dict(d) == p
    new = ("placement", "weightSync", "rolloutMemoryUtilization", "tensorParallel", "ranksPerPod")
    old = {k: v for k, v in d.items() if k not in new}
    old["candidates"] = [{k: v for k, v in c.items() if k not in new} for c in d["candidates"]]
    back = Plan.from_dict(old)
    assert (back.placement, back.weight_sync, back.rollout_memory_utilization, back.tensor_parallel,
            back.ranks_per_pod) == ("disaggregated", "broadcast", 0.9, 1, 1)
    assert {c.placement for c in back.candidates} == {"disaggregated"}
    assert back.summary() == p.summary()


def test_quickstart_plan_is_unchanged():
    p = make_plan(quickstart())
    assert (p.prompts, p.samples_per_prompt, p.rollout_replicas, p.learner_replicas, p.gpus) == (32, 8, 1, 1, 0)
    assert (p.placement, p.weight_sync, p.tensor_parallel, p.ranks_per_pod) == ("disaggregated", "broadcast", 1, 1)
    assert p.rollout_memory_utilization == 0.8  # the cpu profile's, as before
    w = system_model(quickstart()).weight_bytes
    # the sync term as before, with the cpu profile's latency (0.05 s before its refit to the default sweep's 0.11 s)
    assert p.predicted.sync == pytest.approx(w / 2e9 + 0.105)
    # 252.0 before the cpu profile was fitted to measured phases; 363.6 fitted to 32x8 alone on a faster day; 240.0
    # fitted to the default sweep (which measured 245 at 32x8; test_plan_cpu_fit.py holds it to every batch)
    assert p.predicted.samples_per_second == pytest.approx(240.0, abs=0.1)


def test_quickstart_colocated_runs_one_engine_per_learner_process():
    d = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())["spec"]
    d["rollout"]["replicas"] = "auto"
    d["learner"].update(replicas=2, maxReplicas=2)
    p = make_plan(parse_spec({**d, "placement": "colocated"}))
    assert (p.placement, p.rollout_replicas, p.learner_replicas, p.gpus) == ("colocated", 2, 2, 0)
    assert "set by spec.placement" in p.reason


def test_plan_command_shows_the_placement(tmp_path):
    f = tmp_path / "one.yaml"
    f.write_text(yaml.safe_dump({"apiVersion": "rlscale.dev/v1alpha1", "kind": "RLRun", "metadata": {"name": "one"},
                                 "spec": {"model": {"path": "Qwen/Qwen2.5-1.5B-Instruct", "maxLength": 1024},
                                          "task": H100_TASK, "budget": {"gpus": 1},
                                          "hardware": {"accelerator": "H100"}}}))
    r = cli("plan", str(f))
    assert r.returncode == 0, r.stderr
    assert "│ placement      │ colocated: rollout TP 1 (GPUs per engine), engine memory" in r.stdout, r.stdout
    assert "roll*: colocated" in r.stdout
    r = cli("plan", str(f), "--json")
    d = json.loads(r.stdout)
    assert (d["placement"], d["weightSync"], d["tensorParallel"], d["ranksPerPod"]) == ("colocated", "broadcast", 1, 1)
    assert d["rolloutMemoryUtilization"] == 0.5 and d["candidates"][0]["placement"] == "colocated"
