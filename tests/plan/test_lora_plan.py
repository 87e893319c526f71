"""spec.lora in the planner: a 7B LoRA run fits colocated on one GPU (an H100, and a 24 GB L4), the same spec
without LoRA is refused naming spec.lora as the fix, and the LoRA terms (adapter size, learner memory, sync
bytes) follow from the shape."""

from __future__ import annotations

import pytest

from rlscale.plan import make_plan
from rlscale.plan.decision import system_model
from rlscale.plan.errors import PlanError
from rlscale.plan.lora import adapter_params, module_dims
from rlscale.plan.shapes import KNOWN_CONFIGS, shape_from_config
from rlscale.spec import load_rlrun
from rlscale.spec.lora import LoRASpec
from tests.conftest import EXAMPLES


@pytest.mark.parametrize("name", ["grpo-7b-lora-h100.yaml", "grpo-7b-lora-l4.yaml"])
def test_a_7b_lora_run_fits_colocated_on_one_gpu_and_the_full_fine_tune_is_refused_naming_lora(name):
    spec = load_rlrun(EXAMPLES / name).spec
    assert spec.budget.gpus == 1 and spec.lora is not None
    p = make_plan(spec)
    assert (p.placement, p.gpus, p.learner_replicas, p.rollout_replicas) == ("colocated", 1, 1, 1)
    assert not any("microBatchTokens" in n for n in p.notes)  # the example's micro-batch fits as written
    assert any(n.startswith(f"LoRA r={spec.lora.rank}") and "MiB of adapter" in n for n in p.notes)
    model = system_model(spec)
    memory = model.profile.memory * model.profile.memory_utilization
    assert model.learner_memory(1) < memory < model.weight_bytes * 16 / 2  # the full fine-tune's 16 B/param
    full = spec.model_copy(deep=True)
    full.lora = None
    with pytest.raises(PlanError) as err:
        make_plan(full)
    msg = str(err.value)
    assert "training state" in msg and "spec.lora" in msg
    assert "fits (colocated, 1 learner replica(s) on 1 GPU(s))" in msg


def test_the_adapter_size_is_r_times_in_plus_out_of_each_targeted_layer():
    from dataclasses import replace

    shape = shape_from_config(KNOWN_CONFIGS["qwen/qwen2.5-7b"], "table")
    dims = module_dims(shape)
    # Qwen2.5-7B: hidden 3584, 28 heads of 128, 4 KV heads, MLP 18944 (its config)
    assert dims["q_proj"] == (3584, 3584) and dims["k_proj"] == (3584, 512) and dims["down_proj"] == (18944, 3584)
    # a spec's model.shape has no MLP width: recovered from the parameter count (untied head) within 2%
    counted = module_dims(replace(shape, intermediate_size=0))
    assert abs(counted["down_proj"][0] - 18944) / 18944 < 0.02
    per_layer = 2 * 3584 * 2 + 2 * (3584 + 512) + 3 * (3584 + 18944)
    assert abs(adapter_params(shape, LoRASpec(rank=16)) / (16 * 28 * per_layer) - 1) < 0.02
    assert adapter_params(shape, LoRASpec(rank=16, target_modules=["q_proj", "v_proj"])) == 16 * 28 * (7168 + 4096)


def test_lora_moves_the_adapter_not_the_model_and_trains_a_frozen_base():
    spec = load_rlrun(EXAMPLES / "grpo-7b-lora-h100.yaml").spec
    lora = system_model(spec)
    full_spec = spec.model_copy(deep=True)
    full_spec.lora = None
    full = system_model(full_spec)
    assert lora.sync_bytes == lora.adapter_bytes < 0.02 * full.sync_bytes == 0.02 * full.weight_bytes
    assert lora.engine_weight_bytes == full.weight_bytes + lora.adapter_bytes  # the engine's one LoRA slot
    # the frozen base in bf16 and the adapter's weights, gradients and fp32 Adam states
    assert lora.learner_memory(1) == pytest.approx(2 * full.shape.params + 16 * lora.lora_params)
    assert lora.train_flops_per_token() < full.train_flops_per_token()
    assert lora.sync_seconds() < full.sync_seconds()
    merged = spec.model_copy(deep=True)
    merged.lora.modules_to_save = ["lm_head"]  # merged weights go instead of the adapter
    assert system_model(merged).sync_bytes == full.weight_bytes

