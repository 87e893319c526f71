"""Decode tokens/s against concurrency on random-initialised models of real shapes (transformers, eager,
KV cache: prefill a short prompt, then time decode steps with past_key_values), beside the datasheet
roofline and the planner's prediction (decode_step_seconds with the profile's efficiencies and its
per-iteration overhead).

The planner models vLLM (CUDA graphs, paged attention); transformers' eager decode pays Python and a
kernel launch per op, so at small concurrency it sits well below the planner: these rows are shown, not
gated. What is gated: no measurement may beat the roofline (that would be a broken measurement or a
wrong datasheet number in the profile)."""

from __future__ import annotations

import inspect
import sys
import time

from gpu_checks.common import build_model, free, gb, peak_bytes, planner_shape, row, short, sync


def predictions(planner, shape, profile, dtype: str, b: int, context: float) -> tuple[float, float]:
    """(datasheet roofline, planner) decode tokens/s at concurrency b."""
    step = planner.throughput.decode_step_seconds
    w, kv, active = shape.weight_bytes(dtype), shape.kv_bytes_per_token(dtype), shape.active
    roof = step(b, w, kv, context, profile.memory_bandwidth, profile.flops(dtype), active)
    plan = step(b, w, kv, context, profile.memory_bandwidth * profile.bandwidth_efficiency,
                profile.flops(dtype) * profile.decode_flops_efficiency, active) + profile.decode_iteration_overhead_s
    return b / roof, b / plan


def last_logits_only(model) -> dict:
    """Prefill computes the last position's logits only (at b=256 the full ones are GBs), where the
    installed transformers can (logits_to_keep: 4.50+; num_logits_to_keep before)."""
    params = inspect.signature(model.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            return {name: 1}
    return {}


def decode_once(model, s, b: int) -> dict:
    """Prefill a `prompt_tokens` prompt for b sequences, then time `decode_steps` decode steps."""
    import torch

    gen = torch.Generator(device=s.device).manual_seed(b)
    ids = torch.randint(4, model.config.vocab_size, (b, s.prompt_tokens), device=s.device, generator=gen)
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
    return {"step_ms": step * 1e3, "tokens_per_s": b / step,
            "context": s.prompt_tokens + s.warmup_steps + s.decode_steps / 2, "peak_gb": gb(peak_bytes(s.device))}


def decode_row(name: str, b: int, m: dict, roof: float | None, plan: float | None) -> dict:
    note = f"step {m['step_ms']:.2f} ms" + (f", peak {m['peak_gb']:.1f} GB" if m["peak_gb"] is not None else "")
    if roof is not None:
        note += f", roofline {roof:,.0f} tok/s"
    r = row("decode", f"{name} b={b}", "tokens/s", m["tokens_per_s"], plan, note=note, concurrency=b, model=name,
            roofline_tps=roof, **{k: v for k, v in m.items() if k != "tokens_per_s"})
    if roof is not None and m["tokens_per_s"] > roof * 1.05:
        r["verdict"] = "FAIL"
        r["note"] += ": faster than the roofline, so the measurement or the profile's datasheet numbers are wrong"
    return r


def run(s, budget, planner, profile) -> list[dict]:
    import torch

    rows = []
    for name in s.decode_models:
        if not budget.allows(30):
            rows.append(row("decode", name, "tokens/s", verdict="skipped", note="time budget"))
            continue
        model = build_model(name, getattr(torch, s.dtype), s.device).eval()
        shape = planner_shape(planner, name) if planner else None
        decode_once(model, s, 1)  # kernels, cuBLAS handles, allocator: not in the timings
        for b in s.concurrency:
            if not budget.allows(5):
                rows.append(row("decode", f"{name} b={b}", "tokens/s", verdict="skipped", note="time budget"))
                continue
            free(s.device)
            try:
                m = decode_once(model, s, b)
            except torch.cuda.OutOfMemoryError as exc:
                rows.append(row("decode", f"{name} b={b}", "tokens/s", verdict="skipped", note=short(exc, 80)))
                continue
            roof = plan = None
            if shape is not None:
                roof, plan = predictions(planner, shape, profile, s.dtype, b, m["context"])
            rows.append(decode_row(name, b, m, roof, plan))
            print(f"gpu-check: decode {name} b={b}: {m['tokens_per_s']:.0f} tok/s", file=sys.stderr, flush=True)
        del model
        free(s.device)
    return rows
