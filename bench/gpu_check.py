"""GPU check: what only a GPU can tell, measured next to the planner's predictions (docs/gpu.md).

(a) decode tokens/s against concurrency 1..256 on random-initialised models of real shapes
    (Qwen2.5-1.5B and Qwen2.5-7B, bf16, transformers with a KV cache: prefill a short prompt, then
    time decode steps with past_key_values), beside the planner's H200 roofline;
(b) one learner step (single rank, fp32 master weights + bf16 autocast, plain torch AdamW, no
    DeepSpeed; with and without gradient checkpointing): tokens/s and peak memory beside the
    planner's train time and memory;
(c) the GPU preflight (rlscale.gpu_preflight) on the real driver: NVML through ctypes.

Needs torch and transformers only (no vLLM, Ray or DeepSpeed); the planner's numbers come from the
checkout's rlscale.plan (standard library only), and are left out with a note when it cannot be imported.
Writes a markdown table to stdout and to $OUT/gpu_check.md (else bench/out/), plus the same as JSON.
Without a GPU it says so and exits 0; --cpu-smoke runs the same code on a tiny model on the CPU.

    python bench/gpu_check.py                 # or: make gpu-check   (about 3-5 min on an H200)
    python bench/gpu_check.py --cpu-smoke     # the measuring code on CPU, seconds
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import sys
import time
import types
from dataclasses import dataclass, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

# Qwen2.5 configs as published on the hub (config.json), written out: no network on the GPU machine.
QWEN25 = {
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
TINY = {"tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=1, vocab_size=512, tie_word_embeddings=True)}
CONCURRENCY = [1, 2, 4, 8, 16, 32, 64, 128, 256]


@dataclass
class Settings:
    device: str
    dtype: str  # the planner's name: bfloat16 / float32
    profile: str  # planner profile name
    decode_models: list[str]
    learner_models: list[str]
    concurrency: list[int]
    prompt_tokens: int
    decode_steps: int
    warmup_steps: int
    learner_micro_batch: int
    learner_seq: int
    learner_steps: int
    budget_s: float


def settings(args) -> Settings:
    if args.cpu_smoke:
        # no time budget to speak of: a loaded test machine must not turn measurements into skips
        return Settings("cpu", "float32", "cpu", ["tiny"], ["tiny"], [1, 2], 8, 4, 1, 2, 32, 1, 600.0)
    conc = [int(c) for c in args.concurrency.split(",")] if args.concurrency else CONCURRENCY
    return Settings("cuda", "bfloat16", args.profile, args.models.split(","), args.learner_models.split(","),
                    conc, args.prompt_tokens, args.decode_steps, 3, args.micro_batch, args.seq, args.learner_steps,
                    args.budget_s)


# ----------------------------------------------------------------------------- the planner


def import_planner():
    """rlscale.plan's throughput, profiles and shapes modules, or (None, why). They need only the standard
    library; should the package's __init__ fail to import (a dependency the GPU machine lacks), they are
    loaded under a bare package stub instead."""
    names = ("rlscale.plan.throughput", "rlscale.plan.profiles", "rlscale.plan.shapes")
    try:
        return types.SimpleNamespace(**{n.rsplit(".", 1)[1]: importlib.import_module(n) for n in names}), None
    except ImportError as first:
        for name in [m for m in sys.modules if m == "rlscale.plan" or m.startswith("rlscale.plan.")]:
            del sys.modules[name]
        stub = types.ModuleType("rlscale.plan")
        stub.__path__ = [str(ROOT / "rlscale" / "plan")]
        sys.modules["rlscale.plan"] = stub
        try:
            mods = {n.rsplit(".", 1)[1]: importlib.import_module(n) for n in names}
            return types.SimpleNamespace(**mods), f"rlscale.plan loaded without its package ({first})"
        except Exception as exc:  # the planner columns are left out; the measurements stand
            del sys.modules["rlscale.plan"]
            return None, f"planner columns left out: cannot import rlscale.plan ({type(exc).__name__}: {exc})"


def planner_shape(planner, name: str, cfg: dict):
    return planner.shapes.shape_from_config({"model_type": "qwen2", **cfg}, source=f"gpu_check:{name}")


def system_model(planner, shape, profile, dtype: str, seq: int, micro: int, gc: bool):
    """A SystemModel for one single-rank learner step; options the planner does not know yet are dropped."""
    sm = planner.throughput.SystemModel
    known = {f.name for f in fields(sm)}
    kw = dict(shape=shape, profile=profile, dtype=dtype, prompt_tokens=seq / 2, response_tokens=seq / 2,
              max_new_tokens=seq // 2, micro_batch=micro, gradient_checkpointing=gc)
    return sm(**{k: v for k, v in kw.items() if k in known}), "gradient_checkpointing" in known


def decode_predictions(planner, shape, profile, dtype: str, b: int, context: float) -> tuple[float, float]:
    """(datasheet roofline, planner) decode tokens/s at concurrency b: the roofline at the datasheet's
    bandwidth and FLOP/s; the planner's with its efficiencies and per-iteration overhead."""
    step = planner.throughput.decode_step_seconds
    w, kv, active = shape.weight_bytes(dtype), shape.kv_bytes_per_token(dtype), shape.active
    roof = step(b, w, kv, context, profile.memory_bandwidth, profile.flops(dtype), active)
    plan = step(b, w, kv, context, profile.memory_bandwidth * profile.bandwidth_efficiency,
                profile.flops(dtype) * profile.decode_flops_efficiency, active) + profile.decode_iteration_overhead_s
    return b / roof, b / plan


# ----------------------------------------------------------------------------- models


def build_model(name: str, dtype, device: str, gc: bool = False):
    """A random-initialised Qwen2 causal LM of the named shape, built directly on `device`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = {**QWEN25, **TINY}[name]
    config = Qwen2Config(**cfg, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                         use_cache=not gc)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    if gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def free(device: str) -> None:
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_bytes(device: str) -> float | None:
    if device != "cuda":
        return None
    import torch

    return float(torch.cuda.max_memory_allocated())


# ----------------------------------------------------------------------------- (a) decode


def last_logits_only(model) -> dict:
    """Prefill computes the last position's logits only (at b=256 the full ones are GBs), where the
    installed transformers can (logits_to_keep: 4.50+; num_logits_to_keep before)."""
    import inspect

    params = inspect.signature(model.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            return {name: 1}
    return {}


def decode_once(model, s: Settings, b: int) -> dict:
    """Prefill a `prompt_tokens` prompt for b sequences, then time `decode_steps` decode steps."""
    import torch

    vocab = model.config.vocab_size
    gen = torch.Generator(device=s.device).manual_seed(b)
    ids = torch.randint(4, vocab, (b, s.prompt_tokens), device=s.device, generator=gen)
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True, **last_logits_only(model))
        cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        for _ in range(s.warmup_steps):
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        sync(s.device)
        t0 = time.perf_counter()
        for _ in range(s.decode_steps):
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        sync(s.device)
        seconds = time.perf_counter() - t0
    step = seconds / s.decode_steps
    context = s.prompt_tokens + s.warmup_steps + s.decode_steps / 2
    return {"concurrency": b, "step_ms": step * 1e3, "tokens_per_s": b / step, "context": context,
            "peak_gb": _gb(peak_bytes(s.device))}


def _gb(v: float | None) -> float | None:
    return None if v is None else v / 1e9


def measure_decode(s: Settings, planner, profile, started: float) -> list[dict]:
    import torch

    rows = []
    for name in s.decode_models:
        model = build_model(name, getattr(torch, s.dtype), s.device).eval()
        shape = planner_shape(planner, name, {**QWEN25, **TINY}[name]) if planner else None
        decode_once(model, s, 1)  # kernels, cuBLAS handles, allocator: not in the timings
        for b in s.concurrency:
            if time.monotonic() - started > s.budget_s:
                rows.append({"model": name, "concurrency": b, "skipped": "time budget"})
                continue
            free(s.device)
            try:
                row = {"model": name, **decode_once(model, s, b)}
            except torch.cuda.OutOfMemoryError as exc:
                rows.append({"model": name, "concurrency": b, "skipped": f"out of memory: {str(exc)[:80]}"})
                continue
            if shape is not None:
                row["roofline_tps"], row["planner_tps"] = decode_predictions(
                    planner, shape, profile, s.dtype, b, row["context"])
            rows.append(row)
            print(f"decode {name} b={b}: {row['tokens_per_s']:.0f} tok/s", file=sys.stderr, flush=True)
        del model
        free(s.device)
    return rows


# ----------------------------------------------------------------------------- (b) learner


def learner_step(model, opt, ids, adv, amp_dtype) -> None:
    """A GRPO-shaped step: old logprobs (no grad), then the clipped-ratio loss's forward and backward,
    then AdamW: the passes the planner's train_flops_per_token counts (6P + 2P)."""
    import contextlib

    import torch

    def logprobs():
        ctx = torch.autocast("cuda", dtype=amp_dtype) if amp_dtype is not None else contextlib.nullcontext()
        with ctx:
            logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
        return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)

    with torch.no_grad():
        old = logprobs()
    ratio = torch.exp(logprobs() - old)
    loss = -torch.minimum(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def measure_learner_one(s: Settings, name: str, gc: bool) -> dict:
    import torch

    free(s.device)
    model = build_model(name, torch.float32, s.device, gc=gc).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    gen = torch.Generator(device=s.device).manual_seed(0)
    ids = torch.randint(4, model.config.vocab_size, (s.learner_micro_batch, s.learner_seq), device=s.device,
                        generator=gen)
    adv = torch.randn(s.learner_micro_batch, 1, device=s.device, generator=gen)
    amp = torch.bfloat16 if s.device == "cuda" else None
    try:
        learner_step(model, opt, ids, adv, amp)  # warm-up; also allocates Adam's state
        sync(s.device)
        t0 = time.perf_counter()
        for _ in range(s.learner_steps):
            learner_step(model, opt, ids, adv, amp)
        sync(s.device)
        seconds = (time.perf_counter() - t0) / s.learner_steps
    finally:
        params = sum(p.numel() for p in model.parameters())
        del model, opt
    tokens = s.learner_micro_batch * s.learner_seq
    return {"model": name, "gradient_checkpointing": gc, "params": params, "tokens": tokens,
            "step_s": seconds, "tokens_per_s": tokens / seconds, "peak_gb": _gb(peak_bytes(s.device))}


def learner_prediction(planner, profile, s: Settings, name: str, gc: bool) -> dict:
    shape = planner_shape(planner, name, {**QWEN25, **TINY}[name])
    model, knows_gc = system_model(planner, shape, profile, s.dtype, s.learner_seq, s.learner_micro_batch, gc)
    seconds = model.train_seconds(s.learner_micro_batch, 1)
    if gc and not knows_gc:  # an older planner: the recomputed forward, 2P per token, added here
        tokens = s.learner_micro_batch * s.learner_seq
        seconds += 2.0 * shape.active * tokens / (profile.flops(s.dtype) * profile.train_mfu)
    memory = model.learner_memory(1)
    if hasattr(model, "activation_bytes_per_token"):
        memory += s.learner_micro_batch * s.learner_seq * model.activation_bytes_per_token()
    return {"planner_step_s": seconds, "planner_tokens_per_s": s.learner_micro_batch * s.learner_seq / seconds,
            "planner_gb": memory / 1e9, "planner_state_gb": model.learner_memory(1) / 1e9}


def measure_learner(s: Settings, planner, profile, started: float) -> list[dict]:
    import torch

    rows = []
    for name in s.learner_models:
        for gc in (False, True):
            if time.monotonic() - started > s.budget_s:
                rows.append({"model": name, "gradient_checkpointing": gc, "skipped": "time budget"})
                continue
            try:
                row = measure_learner_one(s, name, gc)
            except torch.cuda.OutOfMemoryError as exc:
                row = {"model": name, "gradient_checkpointing": gc, "skipped": f"out of memory: {str(exc)[:80]}"}
            if planner is not None:
                row.update(learner_prediction(planner, profile, s, name, gc))
            rows.append(row)
            print(f"learner {name} gc={gc}: {row.get('tokens_per_s', 0):.0f} tok/s", file=sys.stderr, flush=True)
            free(s.device)
    return rows


# ----------------------------------------------------------------------------- (c) preflight, report


def preflight_line() -> str:
    try:
        from rlscale import gpu_preflight as gp
    except Exception as exc:  # the report still has the measurements
        return f"GPU preflight not run ({type(exc).__name__}: {exc})"
    facts = gp.gather()
    found = gp.problems(facts, 1)
    drv = f"driver {facts.driver_text} from {facts.driver_source}" if facts.driver_text else "driver version unknown"
    nvml = f"{facts.nvml.devices} device(s)" if facts.nvml.devices is not None else facts.nvml.error or "not found"
    verdict = "passes" if not found else "fails: " + "; ".join(found)
    nodes = len(facts.device_nodes)
    return f"GPU preflight {verdict} ({nodes} /dev/nvidiaN, {drv}, NVML: {nvml}, libcuda {facts.libcuda})"


def fmt(v, spec: str = ".0f") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def report(s: Settings, env: dict, decode: list[dict], learner: list[dict], notes: list[str]) -> str:
    lines = [f"# gpu-check: {env['device_name']}", "",
             f"torch {env['torch']}, transformers {env['transformers']}, CUDA {env['cuda']}, "
             f"Python {env['python']}, planner profile {s.profile}, {s.dtype}", "", f"- {env['preflight']}"]
    lines += [f"- {n}" for n in notes]
    lines += ["", f"## Decode (transformers eager, KV cache; prompt {s.prompt_tokens}, {s.decode_steps} timed steps)",
              "", "| model | concurrency | step ms | tokens/s | roofline tokens/s | planner tokens/s "
              "| measured/planner | peak GB |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in decode:
        if "skipped" in r:
            lines.append(f"| {r['model']} | {r['concurrency']} | skipped: {r['skipped']} | | | | | |")
            continue
        ratio = r["tokens_per_s"] / r["planner_tps"] if r.get("planner_tps") else None
        lines.append(f"| {r['model']} | {r['concurrency']} | {fmt(r['step_ms'], '.2f')} | {fmt(r['tokens_per_s'])} "
                     f"| {fmt(r.get('roofline_tps'))} | {fmt(r.get('planner_tps'))} | {fmt(ratio, '.2f')} "
                     f"| {fmt(r['peak_gb'], '.1f')} |")
    lines += ["", f"## Learner step (single rank, AdamW; {s.learner_micro_batch} x {s.learner_seq} tokens; "
              "old-logprob pass + forward/backward + optimizer)", "",
              "| model | grad ckpt | step s | tokens/s | planner tokens/s | measured/planner | peak GB "
              "| planner GB (state + activations) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in learner:
        gc = "yes" if r["gradient_checkpointing"] else "no"
        if "skipped" in r:
            lines.append(f"| {r['model']} | {gc} | skipped: {r['skipped']} | | {fmt(r.get('planner_tokens_per_s'))} "
                         f"| | | {fmt(r.get('planner_gb'), '.1f')} |")
            continue
        ratio = r["tokens_per_s"] / r["planner_tokens_per_s"] if r.get("planner_tokens_per_s") else None
        lines.append(f"| {r['model']} | {gc} | {fmt(r['step_s'], '.3f')} | {fmt(r['tokens_per_s'])} "
                     f"| {fmt(r.get('planner_tokens_per_s'))} | {fmt(ratio, '.2f')} | {fmt(r['peak_gb'], '.1f')} "
                     f"| {fmt(r.get('planner_gb'), '.1f')} |")
    return "\n".join(lines) + "\n"


def environment(device: str) -> dict:
    import torch

    try:
        import transformers

        tv = transformers.__version__
    except ImportError:
        tv = "absent"
    name = torch.cuda.get_device_name(0) if device == "cuda" else f"CPU smoke ({platform.processor() or 'cpu'})"
    preflight = preflight_line() if device == "cuda" else "GPU preflight: not run (CPU smoke)"
    return {"device_name": name, "torch": torch.__version__, "transformers": tv, "cuda": torch.version.cuda,
            "python": platform.python_version(), "preflight": preflight}


def write(text: str, data: dict, out_dir: str | None) -> Path:
    folder = Path(out_dir) if out_dir else ROOT / "bench" / "out"
    folder.mkdir(parents=True, exist_ok=True)
    stem = "gpu_check" if out_dir else f"gpu_check-{time.strftime('%Y%m%d-%H%M%S')}"
    (folder / f"{stem}.json").write_text(json.dumps(data, indent=1))
    path = folder / f"{stem}.md"
    path.write_text(text)
    return path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-smoke", action="store_true", help="a tiny model on the CPU, 2 concurrencies (tests)")
    p.add_argument("--profile", default="H200", help="planner accelerator profile to compare with")
    p.add_argument("--models", default="qwen2.5-1.5b,qwen2.5-7b", help=f"decode models: {', '.join(QWEN25)}")
    p.add_argument("--learner-models", default="qwen2.5-1.5b",
                   help="learner models (7B single-rank with fp32 Adam needs ~122 GB of state alone)")
    p.add_argument("--concurrency", default=None, help="comma-separated; default 1,2,4,...,256")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--learner-steps", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=420.0, help="skip what would start after this many seconds")
    p.add_argument("--out", default=os.environ.get("OUT"), help="folder for the report (default $OUT, else bench/out)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu-check: torch is not installed; nothing measured")
        return 0
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("gpu-check: no GPU here (torch.cuda.is_available() is False); nothing measured. "
              "Run it on a GPU machine (docs/gpu.md), or --cpu-smoke to exercise the code on the CPU.")
        return 0
    s = settings(args)
    started = time.monotonic()
    planner, note = import_planner()
    notes = [note] if note else []
    profile = planner.profiles.PROFILES[s.profile] if planner else None
    if s.device == "cpu":
        torch.set_num_threads(min(2, os.cpu_count() or 1))
    env = environment(s.device)
    decode = measure_decode(s, planner, profile, started)
    learner = measure_learner(s, planner, profile, started)
    notes.append(f"wall {time.monotonic() - started:.0f} s")
    text = report(s, env, decode, learner, notes)
    path = write(text, {"env": env, "settings": s.__dict__, "decode": decode, "learner": learner, "notes": notes},
                 args.out)
    print(text)
    print(f"gpu-check: written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
