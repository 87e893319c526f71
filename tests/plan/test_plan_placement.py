"""Placement in the plan: colocated vs disaggregated, the weight-sync term, the engine's memory check, and
plan dicts written before these fields existed."""

from __future__ import annotations

import json
from dataclasses import replace

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
    assert "Placement colocated: disaggregated does not fit (budget.gpus: 1 does not fit one rollout and one " \
           "learner replica (2 GPUs)" in p.reason
    # one pod: the engine wakes and takes the weights on its GPU, no network; it slept in the train phase
    spec = gpu_spec("Qwen/Qwen2.5-1.5B-Instruct", 1)
    w = system_model(spec).weight_bytes
    assert p.predicted.sync == pytest.approx(w / 25e9 + WAKE_KV_SECONDS + 2 * w / (3.35e12 * 0.8) + 0.1)
    apart = layout_model(system_model(spec), spec, "disaggregated")
    assert p.predicted.train - apart.train_seconds(p.batch, 1) == pytest.approx(w / 25e9)


def test_eight_h100_7b_auto_states_its_choice_in_words():
    spec = gpu_spec("Qwen/Qwen2.5-7B-Instruct", 8, learner={"zeroStage": 3})
    p = make_plan(spec)
    other = "disaggregated" if p.placement == "colocated" else "colocated"
    assert f"Placement {p.placement}: " in p.reason and f"x faster to target than {other}" in p.reason
    assert "generate" in p.reason and "train" in p.reason and "sync" in p.reason
    placements = {c.placement for c in p.candidates}
    assert placements == {"colocated", "disaggregated"}
    best_other = min(make_plan(spec, placement=other).candidates, key=lambda c: c.predicted.time_to_target_seconds)
    assert p.predicted.time_to_target_seconds <= best_other.predicted.time_to_target_seconds
    if p.placement == "colocated":
        assert p.rollout_replicas == p.learner_replicas and p.gpus == p.learner_replicas


def test_colocated_that_does_not_fit_names_the_fields():
    # ZeRO-1 state of a 7B model (42 GB a GPU over 8 ranks) cannot sit beside an engine at 0.5 of 80 GB
    p = make_plan(gpu_spec("Qwen/Qwen2.5-7B-Instruct", 8))
    assert p.placement == "disaggregated"
    assert "colocated does not fit (rollout.gpuMemoryUtilization: 0.5 (colocated)" in p.reason
    with pytest.raises(PlanError, match=r"^spec\.rollout\.gpuMemoryUtilization: 0\.5 .*set placement: disagg"):
        make_plan(gpu_spec("Qwen/Qwen2.5-7B-Instruct", 8, placement="colocated"))
    ok = make_plan(gpu_spec("Qwen/Qwen2.5-7B-Instruct", 8, placement="colocated",
                            rollout={"gpuMemoryUtilization": 0.3}))
    assert ok.placement == "colocated" and ok.rollout_memory_utilization == 0.3


def test_broadcast_is_flat_in_replicas_and_the_object_store_grows():
    base = system_model(gpu_spec("Qwen/Qwen2.5-7B-Instruct", 16))
    w, ib = base.weight_bytes, base.profile.interconnect_bandwidth
    bcast = [base.sync_seconds(r) for r in (1, 2, 4, 8)]
    store = [replace(base, weight_sync="object-store").sync_seconds(r) for r in (1, 2, 4, 8)]
    assert bcast[0] == pytest.approx(w / ib + 0.1) == pytest.approx(store[0])
    assert bcast[-1] - bcast[0] == pytest.approx(7 * BROADCAST_HOP_SECONDS)
    assert [s - 0.1 for s in store] == pytest.approx([w / ib * r for r in (1, 2, 4, 8)])
    # the plan takes the spec's method, and its candidates carry the growing sync
    p = make_plan(gpu_spec("Qwen/Qwen2.5-7B-Instruct", 16, placement="disaggregated",
                           rollout={"weightSync": "object-store"}, learner={"zeroStage": 3}))
    assert p.weight_sync == "object-store"
    assert p.predicted.sync == pytest.approx(w * p.rollout_replicas / ib + 0.1)


def test_colocated_sync_is_on_the_gpu_in_one_pod_and_over_the_network_to_the_others():
    spec = gpu_spec("Qwen/Qwen2.5-7B-Instruct", 8, learner={"zeroStage": 3})
    m = layout_model(system_model(spec), spec, "colocated")
    assert m.rollout_gpus == 1 and m.rollout_utilization == 0.5
    w, ib = m.weight_bytes, m.profile.interconnect_bandwidth
    wake = w / 25e9 + WAKE_KV_SECONDS
    assert m.sync_seconds(1, 1) == pytest.approx(wake + 2 * w / (3.35e12 * 0.8) + 0.1)
    # 8 pods: rank 0's pod on its GPU, the other 7 engines by the broadcast (flat), after ZeRO-3's gather
    gather = 7 / 8 * w / m.profile.collective_bandwidth
    assert m.sync_seconds(8, 8) == pytest.approx(wake + w / ib + 6 * BROADCAST_HOP_SECONDS + gather + 0.1)
    store = replace(m, weight_sync="object-store")
    assert store.sync_seconds(8, 8) == pytest.approx(wake + 7 * w / ib + gather + 0.1)
    assert m.sleep_seconds() == pytest.approx(w / 25e9)


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
    assert ckpt.train_flops_per_token() == pytest.approx(plain.train_flops_per_token() * 10 / 8)
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
    assert p.predicted.sync == pytest.approx(w / 2e9 + 0.05)  # the sync term as before
    assert p.predicted.samples_per_second == pytest.approx(257.7, abs=0.1)


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
