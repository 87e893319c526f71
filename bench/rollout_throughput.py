"""Rollout throughput vs concurrency on one engine, and weight-update time vs a raw copy.

Baselines: throughput at concurrency 1 (each level is printed as a ratio to it), and
a plain tensor copy of the same bytes (the in-place update is printed as a ratio to it).

    .venv/bin/python bench/rollout_throughput.py                  # CPU, the quickstart's shape
    .venv/bin/python bench/rollout_throughput.py --params 0.5B    # GPU, ~0.5B from a config
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

# A ~0.5B Qwen2-like shape for the 17-token vocabulary (the real 0.5B spends 136M
# parameters on a 151k-token embedding; here they all sit in the layers).
PRESETS = {
    "small": dict(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=768),
    "0.5B": dict(hidden_size=1280, num_layers=24, num_heads=20, intermediate_size=3456),
}
CONCURRENCY = (1, 4, 16, 64, 256)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", choices=sorted(PRESETS), default="small", help="model shape preset")
    p.add_argument("--hidden", type=int, help="hidden size (overrides the preset)")
    p.add_argument("--layers", type=int, help="layers (overrides the preset)")
    p.add_argument("--intermediate", type=int, help="MLP size (overrides the preset)")
    p.add_argument("--dtype", default=None, help="float32 on CPU, bfloat16 on GPU by default")
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    p.add_argument("--cpu-threads", type=int, default=1,
                   help="CPU engine threads (EngineConfig.cpu_threads); 0 keeps vLLM's own binding")
    p.add_argument("--min-seconds", type=float, default=2.0, help="measure each level at least this long")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "rollout_throughput.png")
    return p.parse_args(argv)


def build_model(args, path: Path) -> tuple[Path, int]:
    from rlscale.trainer.modeling import save_random_model

    shape = dict(PRESETS[args.params])
    if args.hidden:
        shape["hidden_size"] = args.hidden
    if args.layers:
        shape["num_layers"] = args.layers
    if args.intermediate:
        shape["intermediate_size"] = args.intermediate
    shape["num_heads"] = shape["hidden_size"] // 64  # CPU attention wants head_dim 64
    save_random_model(path, head_dim=64, dtype=args.dtype, **shape)
    from safetensors.torch import load_file

    return path, sum(t.numel() for t in load_file(str(path / "model.safetensors")).values())


def measure_throughput(engine, args) -> list[dict]:
    rows = []
    for c in args.concurrency:
        prompts = [[1] + [4 + (i * 7 + j) % 13 for j in range(args.prompt_tokens - 1)] for i in range(c)]
        kw = dict(max_new_tokens=args.new_tokens, temperature=1.0, ignore_eos=True)
        engine.generate(prompts[: min(c, 4)], seed=0, **kw)  # warm this batch shape
        times, tokens, samples, t_end = [], 0, 0, time.perf_counter() + args.min_seconds
        rep = 0
        while rep < 2 or time.perf_counter() < t_end:
            t0 = time.perf_counter()
            out = engine.generate(prompts, seed=rep, **kw)
            times.append(time.perf_counter() - t0)
            tokens += sum(len(s.token_ids) for g in out for s in g)
            samples += sum(len(g) for g in out)
            rep += 1
        total = sum(times)
        rows.append(dict(concurrency=c, reps=rep, seconds=total, tokens_per_s=tokens / total,
                         samples_per_s=samples / total, call_s_median=statistics.median(times)))
    base = rows[0]
    for r in rows:
        r["tokens_ratio"] = r["tokens_per_s"] / base["tokens_per_s"]
        r["samples_ratio"] = r["samples_per_s"] / base["samples_per_s"]
    return rows


def measure_weight_update(engine, model_dir: Path, reps: int = 9) -> dict:
    import torch
    from safetensors.torch import load_file

    sd = load_file(str(model_dir / "model.safetensors"), device="cuda" if torch.cuda.is_available() else "cpu")
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    # The floor: copy the same tensors into preallocated buffers of the same layout.
    dst = {k: torch.empty_like(v) for k, v in sd.items()}

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    raw, upd = [], []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        for k, v in sd.items():
            dst[k].copy_(v)
        sync()
        raw.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        engine.load_weights(sd, version=engine.version + 1)  # vLLM's layerwise reload + the prefix-cache reset
        sync()
        upd.append(time.perf_counter() - t0)
    med = statistics.median
    r, u = med(raw), med(upd)
    return dict(bytes=nbytes, raw_copy_s=r, update_s=u, ratio=u / r, raw_copy_gb_s=nbytes / r / 1e9,
                path=engine.last_update.get("path"))


def plot(rows, upd, args, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    cs = [r["concurrency"] for r in rows]
    a.plot(cs, [r["tokens_ratio"] for r in rows], "o-", label="tokens/s")
    a.plot(cs, [r["samples_ratio"] for r in rows], "s--", label="samples/s")
    a.set_xscale("log", base=2)
    a.set_yscale("log", base=2)
    a.set_xlabel("concurrent sequences (one engine)")
    a.set_ylabel("throughput / throughput at 1")
    a.grid(True, which="both", alpha=0.3)
    a.legend()
    for r in rows:
        a.annotate(f"{r['tokens_ratio']:.1f}x", (r["concurrency"], r["tokens_ratio"]),
                   textcoords="offset points", xytext=(4, -12), fontsize=8)
    b.bar(["raw copy", "vLLM layerwise reload"], [upd["raw_copy_s"] * 1e3, upd["update_s"] * 1e3],
          color=["#999", "#1f77b4"])
    b.set_ylabel("milliseconds")
    b.set_title(f"weight update = {upd['ratio']:.1f}x raw copy ({upd['bytes'] / 2**20:.0f} MiB)", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    on_gpu = torch.cuda.is_available()
    args.dtype = args.dtype or ("bfloat16" if on_gpu else "float32")
    from rlscale.rollout.engine import EngineConfig, RolloutEngine

    t_start = time.perf_counter()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="rlscale-bench-") as d:
        model_dir, n_params = build_model(args, Path(d) / "model")
        engine = RolloutEngine(EngineConfig(
            model=str(model_dir), dtype=args.dtype, max_num_seqs=max(args.concurrency),
            kv_cache_bytes=1 * 2**30, gpu_memory_utilization=0.8,
            cpu_threads=args.cpu_threads or None,
        ))
        rows = measure_throughput(engine, args)
        upd = measure_weight_update(engine, model_dir)
        engine.close()
    device = torch.cuda.get_device_name(0) if on_gpu else f"CPU x{os.cpu_count()}"
    if not on_gpu:
        device += f", {args.cpu_threads or 'vLLM-bound'} engine thread(s)"
    title = (f"rollout throughput, {n_params / 1e6:.1f}M params {args.dtype} on {device}; "
             f"prompt {args.prompt_tokens} + {args.new_tokens} new tokens")
    # These machines are shared: a 1-minute load above the core count means the figures
    # below are the neighbours' as much as this engine's.
    load = (load_before, os.getloadavg()[0])
    print(title)
    print(f"load average (1 min) {load[0]:.1f} at start, {load[1]:.1f} at end, on {os.cpu_count()} cores")
    print(f"{'concurrency':>11} {'tokens/s':>10} {'x vs 1':>7} {'samples/s':>10} {'x vs 1':>7} {'call s':>8}")
    for r in rows:
        print(f"{r['concurrency']:>11} {r['tokens_per_s']:>10.0f} {r['tokens_ratio']:>7.2f} "
              f"{r['samples_per_s']:>10.1f} {r['samples_ratio']:>7.2f} {r['call_s_median']:>8.3f}")
    # The update is vLLM's layerwise reload, what its weight transfer engines load through. On CPU it includes
    # packing every linear layer's weight again for the oneDNN kernel (the CPU floor: a new handle per layer);
    # on GPU nothing is packed.
    print(f"weight update: {upd['update_s'] * 1e3:.1f} ms by vLLM's layerwise reload vs {upd['raw_copy_s'] * 1e3:.1f} "
          f"ms raw copy of the same {upd['bytes'] / 2**20:.1f} MiB -> {upd['ratio']:.1f}x the copy "
          f"({upd['raw_copy_gb_s']:.1f} GB/s raw)")
    plot(rows, upd, args, title)
    record = dict(title=title, load_average=load, params=n_params, dtype=args.dtype, device=device, throughput=rows,
                  weight_update=upd, seconds=time.perf_counter() - t_start)
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=2))
    print(f"plot: {args.out}  data: {args.out.with_suffix('.json')}  ({record['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
