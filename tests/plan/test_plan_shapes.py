"""Model shapes: the spec's shape, the builtin and hub-id table, local config.json, and the error otherwise."""

from __future__ import annotations

import json

import pytest

from rlscale.plan import PlanError, make_plan, model_shape_for
from rlscale.spec import parse_spec


def shape(path: str, **model):
    return model_shape_for(parse_spec({"model": {"path": path, **model}}))


@pytest.mark.parametrize(("hub_id", "published"), [
    ("Qwen/Qwen2.5-0.5B", 494_032_768),
    ("Qwen/Qwen2.5-7B", 7_615_616_512),
    ("Qwen/Qwen2.5-72B-Instruct", 72_706_203_648),
    ("Qwen/Qwen3-8B", 8_190_735_360),
    ("meta-llama/Llama-3.2-1B", 1_235_814_400),
    ("meta-llama/Llama-3.1-8B-Instruct", 8_030_261_248),
    ("meta-llama/Meta-Llama-3.1-70B", 70_553_706_496),
])
def test_table_params_match_published_totals(hub_id, published):
    s = shape(hub_id)
    assert s.params == published
    assert s.source == "table"


def test_table_geometry_qwen7b_and_llama8b():
    q = shape("qwen/qwen2.5-7b-instruct")  # case and the -Instruct suffix do not matter
    assert (q.layers, q.hidden_size, q.kv_heads, q.head_dim, q.vocab_size) == (28, 3584, 4, 128, 152064)
    ll = shape("meta-llama/Llama-3.3-70B-Instruct")
    assert (ll.layers, ll.hidden_size, ll.kv_heads, ll.head_dim) == (80, 8192, 8, 128)


def test_builtin_tiny_arith_is_about_3_4m_params():
    s = shape("builtin:tiny-arith")
    assert (s.layers, s.hidden_size, s.kv_heads, s.head_dim, s.vocab_size) == (4, 256, 4, 64, 17)
    assert 3.3e6 < s.params < 3.5e6
    assert s.source == "builtin"


def test_spec_shape_wins_over_the_table():
    s = shape("Qwen/Qwen2.5-7B", shape={"params": 1000, "layers": 2, "hiddenSize": 8, "kvHeads": 1,
                                        "headDim": 8, "vocabSize": 10, "activeParams": 500})
    assert (s.params, s.active, s.layers, s.source) == (1000, 500, 2, "spec")


def test_unknown_hub_id_names_field_value_and_fix():
    with pytest.raises(PlanError) as exc:
        make_plan(parse_spec({"model": {"path": "foo/bar"}}))
    msg = str(exc.value)
    assert msg.startswith("spec.model.shape: required for model.path 'foo/bar'")
    assert "add model.shape {params, layers, hiddenSize, kvHeads, headDim, vocabSize}" in msg
    assert isinstance(exc.value, ValueError)


def test_local_directory_config_json(tmp_path):
    cfg = {"model_type": "qwen2", "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 17, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    s = shape(str(tmp_path))
    assert s.source == "config.json"
    assert (s.kv_heads, s.head_dim) == (2, 64)  # head_dim from hidden / heads
    # by hand: embeddings 17*256 + final norm 256 + 4 layers x (q 256*256 + k,v 2*256*128 + o 256*256
    #          + q,k,v biases 256 + 2*128 + 2 norms 2*256 + MLP 3*256*768)
    layer = 256 * 256 + 2 * 256 * 128 + 256 * 256 + 256 + 2 * 128 + 2 * 256 + 3 * 256 * 768
    assert s.params == 17 * 256 + 256 + 4 * layer
    spec = parse_spec({"model": {"path": str(tmp_path)}, "learner": {"gpusPerReplica": 1}})
    assert make_plan(spec).prompts >= 4


def test_local_moe_config_counts_active_params(tmp_path):
    cfg = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "vocab_size": 100, "num_experts": 8, "num_experts_per_tok": 2}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    s = shape(str(tmp_path))
    assert s.active_params is not None
    assert s.active < s.params
    assert s.params - s.active == 2 * (8 - 2) * 3 * 64 * 32  # the idle experts of both layers


def test_directory_without_config_json(tmp_path):
    with pytest.raises(PlanError, match=r"spec.model.shape: required .* without config.json"):
        shape(str(tmp_path))


def test_broken_config_json(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    with pytest.raises(PlanError, match="spec.model.shape"):
        shape(str(tmp_path))
