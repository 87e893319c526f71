"""Small Qwen2 models built from a config, and the in-memory character tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

# Token order is part of the saved model: ids 0-3 are the special tokens, then the
# characters the arithmetic task uses. Changing it invalidates cached models.
PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]
CHARACTERS = list("0123456789+-=")
VOCAB = SPECIAL_TOKENS + CHARACTERS  # 17 tokens


def build_tokenizer():
    """A character-level PreTrainedTokenizerFast (17 tokens) that prepends <bos>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # One token per character; anything outside the vocabulary becomes <unk>.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    # Fuse joins the characters back without the spaces WordLevel would insert.
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",  # prompts are left-padded so generation continues them
        model_max_length=512,
    )


def qwen2_config(
    *,
    vocab_size: int = len(VOCAB),
    hidden_size: int = 256,
    num_layers: int = 4,
    num_heads: int = 4,
    head_dim: int = 64,
    intermediate_size: int = 768,
    tie_embeddings: bool = True,
    dtype: str = "float32",
    max_position_embeddings: int = 256,
):
    """A Qwen2Config for a small model; head_dim must be 64 for vLLM's CPU attention."""
    from transformers import Qwen2Config

    if head_dim * num_heads != hidden_size:
        raise ValueError(
            f"model shape: hidden_size {hidden_size} != num_heads {num_heads} x head_dim "
            f"{head_dim}; choose hidden_size = num_heads * head_dim"
        )
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_embeddings,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        bos_token_id=VOCAB.index(BOS),
        eos_token_id=VOCAB.index(EOS),
        pad_token_id=VOCAB.index(PAD),
        dtype=dtype,
        use_cache=True,
    )


def save_model(model, tokenizer, path: str | Path) -> Path:
    """Write a model and tokenizer as an HF directory (safetensors + generation config)."""
    from transformers import GenerationConfig

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    # Name the generic fast class: otherwise AutoTokenizer picks the model type's own
    # tokenizer class (Qwen2Tokenizer), which may re-derive BPE settings.
    cfg_path = path / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(tok_cfg, indent=2) + "\n")
    gen = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    gen.save_pretrained(path)
    return path


def save_random_model(
    path: str | Path,
    *,
    hidden_size: int = 256,
    num_layers: int = 4,
    num_heads: int = 4,
    head_dim: int = 64,
    intermediate_size: int = 768,
    tie_embeddings: bool = True,
    dtype: str = "float32",
    seed: int = 0,
) -> Path:
    """Write a randomly initialised Qwen2 model with the character tokenizer to `path`."""
    import torch
    from transformers import Qwen2ForCausalLM

    config = qwen2_config(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        head_dim=head_dim,
        intermediate_size=intermediate_size,
        tie_embeddings=tie_embeddings,
        dtype=dtype,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    return save_model(model, build_tokenizer(), path)


def load_model(path: str | Path, dtype: str = "float32"):
    """Load an HF causal LM from a local directory (never from a hub)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(path), dtype=getattr(torch, dtype), local_files_only=True
    )


def model_shape(path: str | Path) -> dict:
    """The shape fields the planner reads, from a model directory's config.json."""
    cfg = json.loads((Path(path) / "config.json").read_text())
    return {
        "layers": cfg["num_hidden_layers"],
        "hiddenSize": cfg["hidden_size"],
        "kvHeads": cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
        "headDim": cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
        "vocabSize": cfg["vocab_size"],
    }
