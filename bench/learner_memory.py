"""Peak learner memory of one micro-batch (forward + backward of the policy loss), with and without
gradient checkpointing and chunked log-probs (trainer/logprobs.py), on a Qwen2-like model built from
its config (no download): vocab 32k, 4 layers, hidden 256, sequences of 512 tokens.

    .venv/bin/python bench/learner_memory.py [--sequences 4] [--length 512] [--device cpu|cuda]

Each variant runs in a process of its own. Peak: on CUDA, torch.cuda.max_memory_allocated minus the
allocation before the forward; on CPU, the peak resident set (VmHWM, reset through /proc/self/clear_refs
after set-up) minus the resident set before the forward. Prints each variant's peak, its ratio to the
baseline (no checkpointing, full logits) and its loss and gradient norm (the same within float tolerance).

    .venv/bin/python bench/learner_memory.py --per-layer qwen/qwen2.5-0.5b,qwen/qwen2.5-7b [--dtype bfloat16]

measures instead the activation bytes one decoder layer keeps for the backward pass, per token, in units
of the hidden size h: the shipped shape's layer (rlscale/plan/shapes.py's table: hidden, MLP, heads) built
with 1 and then 2 layers and a 1,024-token vocabulary, one forward of the policy loss through the
trainer's code path under torch's saved-tensor hooks, summing each saved storage once (parameters
excluded); the 2-layer sum less the 1-layer sum is one layer's. The planner's
ACTIVATION_BYTES_PER_HIDDEN (rlscale/plan/throughput.py) is this figure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {  # name: (gradient checkpointing, logprob chunk; 0 = full logits)
    "baseline": (False, 0),
    "checkpointing": (True, 0),
    "chunked-logprobs": (False, 1024),
    "both": (True, 1024),
}


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _loss(model, mb, chunk: int):
    """GRPO's on-policy surrogate, token mean: -A exp(logp - logp.detach()); and the entropy."""
    import torch

    from rlscale.trainer.logprobs import response_logprobs

    logp, entropy = response_logprobs(model, mb, chunk)
    loss = (-(mb.advantages[:, None] * torch.exp(logp - logp.detach())) * mb.mask).sum() / mb.mask.sum()
    return loss, entropy


def one(variant: str, sequences: int, length: int, device: str) -> dict:
    """Build the model and a batch, run one micro-batch's forward and backward, report the peak."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlscale.trainer.batching import RolloutBatch, pack
    from rlscale.trainer.learner_config import enable_gradient_checkpointing

    ckpt, chunk = VARIANTS[variant]
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=32000, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=4, head_dim=64, max_position_embeddings=length,
                      tie_word_embeddings=True, use_cache=False)
    model = Qwen2ForCausalLM(cfg).to(device)
    if ckpt:
        enable_gradient_checkpointing(model)
    gen = torch.Generator().manual_seed(1)
    prompt = length // 4
    ids = torch.randint(3, 32000, (sequences, length), generator=gen).tolist()
    batch = RolloutBatch([s[:prompt] for s in ids], [s[prompt:] for s in ids], [float(i % 2) for i in range(sequences)],
                         samples_per_prompt=sequences)
    advantages = torch.linspace(-0.5, 1.0, sequences)
    mb = pack(batch, list(range(sequences)), advantages, device)
    # Warm-up on a short micro-batch: kernels, thread pools and allocator arenas are set up before the
    # measurement; the gradients are freed again, so the measured step allocates them as a real one does.
    short = RolloutBatch([s[:4] for s in ids[:1]], [s[4:16] for s in ids[:1]], [0.0], samples_per_prompt=1)
    _loss(model, pack(short, [0], torch.ones(1), device), chunk)[0].backward()
    model.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set (VmHWM)
        before = _rss("VmRSS")
    loss, entropy = _loss(model, mb, chunk)
    loss.backward()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = _rss("VmHWM") - before
    grad_norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
    return {"variant": variant, "peak_bytes": peak, "loss": loss.item(), "grad_norm": grad_norm.item(),
            "entropy": (entropy.detach() * mb.mask).sum().item() / mb.mask.sum().item()}


def saved_bytes(shape: str, layers: int, sequences: int, length: int, dtype: str) -> dict:
    """Bytes of the tensors autograd keeps for the backward pass of one micro-batch's policy loss, each
    storage counted once, the model's parameters left out."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlscale.plan.shapes import KNOWN_CONFIGS
    from rlscale.trainer.batching import RolloutBatch, pack

    c = KNOWN_CONFIGS[shape]
    cfg = Qwen2Config(vocab_size=1024, hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
                      num_hidden_layers=layers, num_attention_heads=c["num_attention_heads"],
                      num_key_value_heads=c["num_key_value_heads"], head_dim=c["head_dim"],
                      max_position_embeddings=length, tie_word_embeddings=True, use_cache=False)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(getattr(torch, dtype))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 1024, (sequences, length), generator=gen).tolist()
    prompt = length // 4
    batch = RolloutBatch([s[:prompt] for s in ids], [s[prompt:] for s in ids], [float(i % 2) for i in range(sequences)],
                         samples_per_prompt=sequences)
    mb = pack(batch, list(range(sequences)), torch.linspace(-0.5, 1.0, sequences), "cpu")
    seen: dict[int, int] = {}

    def keep(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        _loss(model, mb, 0)
    return {"shape": shape, "layers": layers, "tokens": sequences * length, "hidden": c["hidden_size"],
            "intermediate": c["intermediate_size"], "saved_bytes": sum(seen.values()),
            "attention": model.config._attn_implementation}


def per_layer(shapes: list[str], sequences: int, length: int, dtype: str) -> None:
    print(f"activation bytes kept per token per layer, {dtype}, {sequences} x {length} tokens, forward of the "
          "policy loss (saved-tensor hooks)")
    print(f"{'shape':<22} {'h':>6} {'mlp':>6} {'attention':>10} {'bytes/token/layer':>18} {'/ h':>7}")
    for shape in shapes:
        runs = []
        for layers in (1, 2):
            cmd = [sys.executable, __file__, "--saved", shape, "--layers", str(layers), "--sequences",
                   str(sequences), "--length", str(length), "--dtype", dtype]
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
        one_layer = (runs[1]["saved_bytes"] - runs[0]["saved_bytes"]) / runs[0]["tokens"]
        print(f"{shape:<22} {runs[0]['hidden']:6d} {runs[0]['intermediate']:6d} {runs[0]['attention']:>10} "
              f"{one_layer:18,.0f} {one_layer / runs[0]['hidden']:7.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # run one variant in this process
    ap.add_argument("--per-layer", help="comma-separated shapes of rlscale/plan/shapes.py's table: measure the "
                    "activation bytes a layer keeps per token instead")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--saved", help=argparse.SUPPRESS)  # one --per-layer measurement in this process
    ap.add_argument("--layers", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.saved:
        print(json.dumps(saved_bytes(a.saved, a.layers, a.sequences, a.length, a.dtype)))
        return
    if a.per_layer:
        per_layer(a.per_layer.split(","), a.sequences, a.length, a.dtype)
        return
    if a.one:
        print(json.dumps(one(a.one, a.sequences, a.length, a.device)))
        return
    results = []
    for name in VARIANTS:
        cmd = [sys.executable, __file__, "--one", name, "--sequences", str(a.sequences), "--length", str(a.length),
               "--device", a.device]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    base = results[0]
    print(f"micro-batch: {a.sequences} sequences x {a.length} tokens, vocab 32000, 4 layers, hidden 256, "
          f"device {a.device}")
    print(f"{'variant':<18} {'peak MiB':>9} {'vs baseline':>11} {'loss':>14} {'grad norm':>12} {'entropy':>9}")
    for r in results:
        print(f"{r['variant']:<18} {r['peak_bytes'] / 2**20:9.1f} {r['peak_bytes'] / base['peak_bytes']:11.3f} "
              f"{r['loss']:14.8f} {r['grad_norm']:12.6f} {r['entropy']:9.5f}")
    worst = max(abs(r["loss"] - base["loss"]) for r in results)
    print(f"largest loss difference from the baseline: {worst:.3g}")


if __name__ == "__main__":
    main()
