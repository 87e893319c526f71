"""spec.lora's parts on a tiny in-memory model (no DeepSpeed, no vLLM): the merged weights, the adapter's names and
the directory the engines load, the base's identity, and the driver's sleep level."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlscale.spec.lora import LoRASpec
from rlscale.trainer.lora import policy as P

LORA = LoRASpec(rank=8, alpha=16).peft_kwargs()


def tiny(seed: int = 0):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    cfg = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=40, max_position_embeddings=64, tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def trained_policy(seed: int = 0):
    model = P.wrap(tiny(seed), LORA)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model


IDS = torch.tensor([[1, 5, 9, 3, 7, 2]])


def test_the_merged_weights_are_the_policy_under_the_base_models_names():
    import copy

    model = trained_policy()
    merged = dict(P.merged_items(model))
    ref = copy.deepcopy(model).merge_and_unload()
    assert sorted(merged) == sorted(n for n, _ in ref.named_parameters())
    assert max(float((merged[n] - p).abs().max()) for n, p in ref.named_parameters()) < 1e-6
    plain = tiny(1)
    plain.load_state_dict(merged, strict=False)
    with torch.no_grad():
        assert torch.allclose(plain(IDS).logits, model(IDS).logits, atol=1e-5)
        # the reference: the same module with the adapter off is the base
        ref_logits = P.Reference(None, model)(input_ids=IDS).logits
        assert torch.allclose(ref_logits, tiny(0)(IDS).logits, atol=1e-6)
        assert not torch.allclose(ref_logits, model(IDS).logits, atol=1e-3)


def test_only_the_adapter_trains_and_sync_sends_it_under_peft_file_names(tmp_path):
    from safetensors.torch import load_file

    model = trained_policy()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    items = dict(P.sync_items(model, "adapter"))
    model.save_pretrained(tmp_path / "a")
    assert set(items) == set(load_file(tmp_path / "a" / "adapter_model.safetensors"))
    assert [(n, s) for n, _, s in P.sync_meta(model, "adapter")] == [(n, tuple(t.shape)) for n, t in items.items()]
    assert [n for n, _, _ in P.sync_meta(model, "merged")] == [n for n, _ in P.merged_items(model)]
    assert (P.sync_mode(None), P.sync_mode(LORA), P.sync_mode({**LORA, "modules_to_save": ["lm_head"]})) == \
        ("full", "adapter", "merged")


def test_the_directory_the_engine_writes_loads_in_peft_as_the_same_policy(tmp_path):
    from peft import PeftModel

    from rlscale.rollout.lora import AdapterSink, adapter_config, write_adapter

    model = trained_policy()
    sink = AdapterSink()
    buf = {n: t.clone() for n, t in P.sync_items(model, "adapter")}
    sink.load_weights(buf.items())
    for t in buf.values():
        t.zero_()  # the transfer engine reuses its receive buffer: the sink kept copies
    cfg = adapter_config(sink.tensors, 16)
    assert cfg["r"] == 8 and cfg["lora_alpha"] == 16
    assert cfg["target_modules"] == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                            "down_proj"])
    d = write_adapter(sink.tensors, tmp_path / "v3", 16)
    loaded = PeftModel.from_pretrained(tiny(0), d).eval()
    with torch.no_grad():
        assert torch.allclose(loaded(IDS).logits, model(IDS).logits, atol=1e-5)
    with pytest.raises(ValueError, match="one rank"):
        adapter_config({"x.lora_A.weight": torch.zeros(4, 3), "y.lora_A.weight": torch.zeros(8, 3)}, None)


def test_a_checkpoint_is_tied_to_its_base_and_adapter_shape(tmp_path):
    from rlscale.trainer.lora.identity import base_identity, check_same_base

    tiny(0).save_pretrained(tmp_path / "a")
    tiny(1).save_pretrained(tmp_path / "b")
    a, b = base_identity(tmp_path / "a"), base_identity(tmp_path / "b")
    assert a["sha256"] != b["sha256"] and a == base_identity(tmp_path / "a")
    saved = {"base": a, "config": LORA}
    check_same_base(saved, a, LORA, "ck")  # the same: no error
    with pytest.raises(RuntimeError, match="trained on the base at .*/a'"):
        check_same_base(saved, b, LORA, "ck")
    with pytest.raises(RuntimeError, match="spec.lora now gives"):
        check_same_base(saved, a, {**LORA, "r": 16}, "ck")
    with pytest.raises(RuntimeError, match="full-model checkpoint"):
        check_same_base(None, a, LORA, "ck")


@pytest.mark.parametrize(("lora", "level"), [(None, 2), (LoRASpec(), 1), (LoRASpec(modules_to_save=["lm_head"]), 2)])
def test_colocated_engines_keep_their_base_asleep_when_updates_are_adapters(lora, level):
    from rlscale.trainer.driver import Driver

    calls = []
    d = SimpleNamespace(spec=SimpleNamespace(lora=lora), plan=SimpleNamespace(placement="colocated"),
                        rollout=SimpleNamespace(sleep=lambda level: calls.append(level)),
                        learner=SimpleNamespace(reload_states=lambda: calls.append("reload")))
    d._colocated = Driver._colocated.__get__(d)
    Driver._hand_to_learner(d)
    assert calls == [level, "reload"]


def test_a_lora_runs_engines_are_built_to_serve_one_adapter_of_its_rank():
    from rlscale.rollout.engine import EngineConfig, engine_kwargs
    from rlscale.spec import load_rlrun
    from rlscale.trainer.run_env import engine_lora
    from tests.conftest import EXAMPLES

    spec = load_rlrun(EXAMPLES / "quickstart-lora.yaml").spec
    lora = engine_lora(spec)
    assert lora == {"rank": 16, "alpha": 32}
    kw = engine_kwargs(EngineConfig(model="m", lora=lora), on_gpu=False)
    assert (kw["enable_lora"], kw["max_lora_rank"], kw["max_loras"]) == (True, 16, 1)
    assert "enable_lora" not in engine_kwargs(EngineConfig(model="m"), on_gpu=False)
    spec.lora.modules_to_save = ["lm_head"]  # merged updates: the engine serves plain weights
    assert engine_lora(spec) is None
    assert engine_lora(load_rlrun(EXAMPLES / "quickstart.yaml").spec) is None


def test_the_planned_adapter_is_the_one_peft_builds():
    """The SmolLM2 example's adapter (rank 16, all-linear) as the planner counts it and as peft builds it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    from rlscale.plan.lora import adapter_params
    from rlscale.plan.shapes import BUILTIN_CONFIGS, shape_from_config

    cfg = {**BUILTIN_CONFIGS["builtin:smollm2-135m-instruct"], "num_hidden_layers": 2}  # two layers: small
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**{k: v for k, v in cfg.items() if k != "model_type"}))
    built = sum(p.numel() for p in get_peft_model(model, LoraConfig(r=16, target_modules="all-linear")).parameters()
                if p.requires_grad)
    assert adapter_params(shape_from_config(cfg, "builtin"), LoRASpec(rank=16)) == built


def test_a_publish_says_it_sent_an_adapter_and_the_step_records_its_bytes(caplog):
    from rlscale.trainer.driver import Driver
    from rlscale.trainer.transfer.publisher import SyncResult
    from rlscale.trainer.transfer.sources import StreamSource

    source = StreamSource(lambda: [], lambda: iter(()))
    source.kind = "adapter"
    rollout = SimpleNamespace(publish_weights=lambda v, w: SyncResult(v, "gloo", replicas=1, seconds=0.05,
                                                                       tensor_bytes=3 * 2**19, kind=w.kind))
    d = SimpleNamespace(rollout=rollout, state=SimpleNamespace(version=3), _weight_source=lambda: (source, None))
    with caplog.at_level("INFO", logger="rlscale.driver"):
        Driver.publish(d)
    assert d.sync_bytes == 3 * 2**19
    assert "adapter v3 by gloo to 1 replica in 0.05 s (1.5 MiB)" in caplog.text
