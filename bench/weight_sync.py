"""Weight updates through vLLM's weight transfer protocol at 1, 2 and 4 rollout replicas, in one run.

Per update and replica count: the seconds until every replica holds the new version; the bytes each side
sent (the learner's side into the wire, each replica's forward along the chain) against the naive fan-out
baseline, where the learner sends the whole weights to every replica (R x W); and each receiver's peak
extra memory against one bucket: its receive buffers (counted in the engine) and its process's peak RSS
above the RSS at the update's start (Linux's VmHWM, reset per update). Backends: `gloo` (the CPU stand-in
for vLLM's nccl, disaggregated) at every replica count, and `shm` (the stand-in for ipc, colocated) at 1.

    .venv/bin/python bench/weight_sync.py                       # CPU, ~14M parameters, 1 2 4 replicas
    .venv/bin/python bench/weight_sync.py --hidden 256 --layers 2 --updates 2 --replicas 1 2

spec.lora (`--lora RANK`): one gloo replica of `--model` (default the SmolLM2 example's model) serving the base
with vLLM's LoRA takes adapter updates (all-linear, rank RANK), and one plain replica takes full updates; the
bytes and seconds of each, and the adapter's share of the model's bytes:

    .venv/bin/python bench/weight_sync.py --lora 16            # SmolLM2-135M: adapter vs whole-model updates
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MiB = 2**20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--updates", type=int, default=3, help="measured updates per replica count")
    p.add_argument("--bucket-mib", type=float, default=8.0, help="the transfer's bucket (several per update)")
    p.add_argument("--out", type=Path, default=None, help="default: out/weight_sync.json (--lora: "
                   "out/weight_sync_lora.json)")
    p.add_argument("--lora", type=int, default=0, metavar="RANK", help="adapter updates of this rank vs full ones")
    p.add_argument("--model", default="builtin:smollm2-135m-instruct", help="--lora: the base model (a builtin "
                   "name or a model directory)")
    args = p.parse_args(argv)
    name = "weight_sync_lora.json" if args.lora else "weight_sync.json"
    args.out = args.out or Path(__file__).parent / "out" / name
    return args


def state_dicts(model_dir: str, n: int) -> list[dict]:
    """n different sets of the model's weights (each update changes every byte)."""
    import torch
    from safetensors.torch import load_file

    base = load_file(os.path.join(model_dir, "model.safetensors"))
    return [{k: v + 0.01 * (i + 1) * torch.randn_like(v) for k, v in base.items()} for i in range(n)]


def adapters(model_dir: str, rank: int, n: int) -> list[dict]:
    """n different adapters (all-linear, alpha 2 x rank) as a LoRA learner sends them: peft's tensors, B random."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rlscale.trainer.lora.policy import adapter_state

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                           LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear"))
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(0.01 * torch.randn(p.shape, generator=g))
        out.append({k: v.clone() for k, v in adapter_state(model).items()})
    return out


def measure(model_dir: str, backend: str, replicas: int, weights: list[dict], bucket: int,
            lora: dict | None = None, max_model_len: int | None = None) -> dict:
    """Deploy `replicas` replicas built for `backend`, publish each of `weights`; the per-update figures.
    `lora`: the replicas serve the base with vLLM's LoRA and `weights` are adapters."""
    from rlscale.rollout.engine import EngineConfig
    from rlscale.rollout.serve import RolloutClient, RolloutOptions
    from rlscale.rollout.transfer.buckets import largest_bucket, metas, plan_buckets
    from rlscale.trainer.transfer.sources import TensorsSource

    client = RolloutClient.deploy(
        EngineConfig(model=model_dir, kv_cache_bytes=64 * MiB, max_num_seqs=16, transfer_backend=backend, lora=lora,
                     max_model_len=max_model_len),
        RolloutOptions(app_name=f"bench-ws-{backend}-{replicas}{'-lora' if lora else ''}", num_replicas=replicas,
                       sync_timeout_s=300,
                       bucket_bytes=bucket))
    try:
        client.wait_replicas(replicas, timeout_s=900)
        meta = metas(TensorsSource(weights[0]).metadata())
        bound = largest_bucket(meta, plan_buckets(meta, bucket))
        client.publish_weights(1, weights[0])  # forms the group; not measured
        rows = []
        for i, w in enumerate(weights[1:], start=2):
            res = client.publish_weights(i, w)
            assert res.replicas == replicas, res.describe()
            recv = list(res.receivers.values())
            rows.append(dict(seconds=res.seconds, sent=res.bytes_sent, weights=res.tensor_bytes,
                             received=[r["received"] for r in recv], forwarded=[r["forwarded"] for r in recv],
                             buffer_peak=max(r["buffer_peak"] for r in recv),
                             rss_growth=max((r["rss_growth"] or 0) for r in recv)))
        med = statistics.median
        return dict(backend=backend, replicas=replicas, bucket=bound, updates=rows,
                    seconds=med(r["seconds"] for r in rows), weights=rows[0]["weights"],
                    sent=med(r["sent"] for r in rows), forwarded=med(sum(r["forwarded"]) for r in rows),
                    buffer_peak=max(r["buffer_peak"] for r in rows), rss_growth=max(r["rss_growth"] for r in rows))
    finally:
        client.shutdown()


def main_lora(args) -> int:
    """Adapter updates against whole-model updates on one gloo replica of args.model."""
    import ray

    from rlscale.trainer.builtin import resolve_model_path

    model_dir = str(resolve_model_path(args.model))
    bucket = int(args.bucket_mib * MiB)
    ray.init(address="local", num_cpus=2, resources={"rollout": 1}, include_dashboard=False, log_to_driver=False)
    try:
        # a short context: 64 MiB of KV cache holds no request of SmolLM2's 8,192 positions
        lora = measure(model_dir, "gloo", 1, adapters(model_dir, args.lora, args.updates + 1), bucket,
                       lora={"rank": args.lora, "alpha": 2 * args.lora}, max_model_len=256)
        full = measure(model_dir, "gloo", 1, state_dicts(model_dir, args.updates + 1), bucket, max_model_len=256)
    finally:
        from ray import serve

        serve.shutdown()
        ray.shutdown()
    share = lora["weights"] / full["weights"]
    print(f"{args.model}: {args.updates} updates each by gloo to 1 replica")
    for what, x in (("whole model", full), (f"LoRA r={args.lora} adapter", lora)):
        print(f"{what:>20}: {x['weights'] / MiB:8.2f} MiB per update, learner sent {x['sent'] / MiB:8.2f} MiB, "
              f"{x['seconds']:.3f} s per update")
    print(f"adapter bytes per update: {100 * share:.2f}% of the whole model's")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(args={k: str(v) for k, v in vars(args).items()}, lora=lora, full=full,
                                        adapter_share=share, at=time.strftime("%Y-%m-%d %H:%M:%S")), indent=1))
    print(f"wrote {args.out}")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.lora:
        return main_lora(args)
    import ray

    from rlscale.trainer.modeling import save_random_model

    tmp = tempfile.mkdtemp(prefix="bench-ws-")
    model_dir = str(save_random_model(Path(tmp) / "m", seed=0, hidden_size=args.hidden, num_layers=args.layers,
                                      num_heads=args.hidden // 64, head_dim=64,
                                      intermediate_size=args.intermediate))
    weights = state_dicts(model_dir, args.updates + 1)
    bucket = int(args.bucket_mib * MiB)
    ray.init(address="local", num_cpus=2, resources={"rollout": max(args.replicas)}, include_dashboard=False,
             log_to_driver=False)
    results = []
    try:
        for r in args.replicas:
            results.append(measure(model_dir, "gloo", r, weights, bucket))
        results.append(measure(model_dir, "shm", 1, weights, bucket))
    finally:
        from ray import serve

        serve.shutdown()
        ray.shutdown()
    w = results[0]["weights"]
    print(f"weights {w / MiB:.1f} MiB, bucket {bucket / MiB:.0f} MiB (largest {results[0]['bucket'] / MiB:.1f} MiB), "
          f"{args.updates} updates each; baseline: the learner sends the weights to every replica (R x W)")
    print(f"{'backend':>7} {'R':>2} {'s/update':>9} {'learner sent':>13} {'vs R x W':>9} {'forwarded/replica':>18} "
          f"{'recv buffer peak':>17} {'RSS peak growth':>16}")
    for x in results:
        b, r = x["bucket"], x["replicas"]
        print(f"{x['backend']:>7} {r:>2} {x['seconds']:>9.3f} {x['sent'] / MiB:>9.1f} MiB {x['sent'] / (r * w):>8.2f}x "
              f"{x['forwarded'] / max(1, r) / MiB:>14.1f} MiB {x['buffer_peak'] / b:>12.2f} bkt "
              f"{x['rss_growth'] / b:>11.2f} bkt")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(args={k: str(v) for k, v in vars(args).items()}, results=results,
                                        at=time.strftime("%Y-%m-%d %H:%M:%S")), indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
