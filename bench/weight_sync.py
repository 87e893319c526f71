"""Weight updates by broadcast vs by the object store, at 1, 2 and 4 rollout replicas, in one run.

Per update: seconds until every replica holds the new version, and bytes the learner's side sends.
Baseline: the object-store path at the same replica count (every figure is printed as a ratio to it).

- broadcast: `bytes sent` is what the sender wrote into the group (counted in its code), checked
  against the kernel's own count: TCP bytes acknowledged on this process's sockets during the update
  (tcp_info, which also holds Ray's own small traffic);
- object store: every replica pulls the whole weights from the learner's node, so `bytes sent` is
  size x pulls (on this one machine the pulls are shared-memory reads; across nodes they are the
  learner node's egress, which is what the issue measured: ~122 GB per update at 7B and 8 replicas).

    .venv/bin/python bench/weight_sync.py                       # CPU, ~14M parameters, 1 2 4 replicas
    .venv/bin/python bench/weight_sync.py --hidden 256 --layers 2 --updates 2
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TCPI_BYTES_ACKED = 120  # offset of tcpi_bytes_acked in Linux's struct tcp_info


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--updates", type=int, default=3, help="measured updates per method and replica count")
    p.add_argument("--chunk-kib", type=int, default=4096, help="gloo chain chunk size")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "weight_sync.json")
    return p.parse_args(argv)


def tcp_bytes_sent() -> int:
    """Bytes the kernel counts as sent and acknowledged on this process's open TCP sockets."""
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM:
                info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
                if len(info) >= TCPI_BYTES_ACKED + 8:
                    total += struct.unpack_from("Q", info, TCPI_BYTES_ACKED)[0]
        except OSError:
            pass
        finally:
            s.close()
    return total


def weights(path: Path, version: int) -> dict:
    """The model's own tensors, nudged per version (every update changes every byte that matters)."""
    from safetensors.torch import load_file

    return {k: v + version * 1e-3 if v.is_floating_point() else v
            for k, v in load_file(str(path / "model.safetensors")).items()}


def wait_loaded(client, version: int, n: int, timeout_s: float = 300.0) -> list[tuple]:
    import ray

    deadline = time.monotonic() + timeout_s
    while len(rows := [r for r in ray.get(client._store.loads.remote()) if r[1] == version]) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(rows)} of {n} replicas loaded v{version}")
        time.sleep(0.01)
    return rows


def measure(client, model: Path, version: int, n: int, method: str) -> dict:
    client.options.weight_sync = method
    ws = weights(model, version)
    tcp0, t0 = tcp_bytes_sent(), time.perf_counter()
    res = client.publish_weights(version, ws)
    rows = wait_loaded(client, version, n)
    wall = time.perf_counter() - t0
    tcp = tcp_bytes_sent() - tcp0
    t1 = time.perf_counter()
    client._publisher.flush()  # a broadcast's object-store copy is put behind it: not on the update's path
    behind = time.perf_counter() - t1
    pulls = sum(1 for r in rows if r[2] == "object-store")
    return {"wall": wall, "publish": res.seconds, "put": res.put_seconds, "bcast": res.broadcast_seconds,
            "critical": res.put_seconds + max(r[3] for r in rows) if method == "object-store" else res.seconds,
            "bytes": res.bytes_sent + pulls * res.tensor_bytes, "tcp": tcp, "size": res.tensor_bytes,
            "method": res.method, "replicas": res.replicas, "put_behind_wait": behind}


def run(args) -> list[dict]:
    import ray

    from rlscale.rollout.engine import EngineConfig
    from rlscale.rollout.serve import RolloutClient, RolloutOptions
    from rlscale.trainer.modeling import save_random_model

    tmp = Path(tempfile.mkdtemp(prefix="rlscale-bench-ws-"))
    model = save_random_model(tmp / "m", seed=0, hidden_size=args.hidden, num_layers=args.layers,
                              num_heads=args.hidden // 64, head_dim=64, intermediate_size=args.intermediate)
    ray.init(address="local", num_cpus=2, resources={"rollout": max(args.replicas)}, include_dashboard=False,
             log_to_driver=False)
    client = RolloutClient.deploy(
        EngineConfig(model=str(model), kv_cache_bytes=64 * 2**20, max_num_seqs=16),
        RolloutOptions(app_name="bench-ws", num_replicas=args.replicas[0], sync_chunk_bytes=args.chunk_kib * 1024,
                       version_wait_s=120.0))
    rows, version = [], 0
    try:
        for n in args.replicas:
            client.scale(n)
            client.wait_replicas(n, timeout_s=900)
            for method in ("object-store", "auto"):
                version += 1
                measure(client, model, version, n, method)  # warm-up; "auto" forms the group for this n
                for _ in range(args.updates):
                    version += 1
                    rows.append({"n": n, **measure(client, model, version, n, method)})
                    print(f"  n={n} {rows[-1]['method']:12s} {rows[-1]['wall']:.3f} s", flush=True)
    finally:
        client.shutdown()
        ray.shutdown()
    return rows


def report(rows: list[dict]) -> None:
    def med(n, method, key):
        return statistics.median(r[key] for r in rows if r["n"] == n and r["method"] == method)

    size = rows[0]["size"]
    print(f"\nweights: {size / 2**20:.1f} MiB per update; medians of the measured updates\n")
    print(f"{'replicas':>8} {'method':>12} {'s/update':>9} {'ratio':>6} {'crit s':>7} {'ratio':>6} "
          f"{'learner MiB':>11} {'ratio':>6} {'TCP MiB':>8}")
    for n in sorted({r["n"] for r in rows}):
        base = {k: med(n, "object-store", k) for k in ("wall", "critical", "bytes")}
        for method in ("object-store", "broadcast"):
            if not any(r["n"] == n and r["method"] == method for r in rows):
                continue
            w, c, b, t = (med(n, method, k) for k in ("wall", "critical", "bytes", "tcp"))
            print(f"{n:>8} {method:>12} {w:>9.3f} {w / base['wall']:>6.2f} {c:>7.3f} {c / base['critical']:>6.2f} "
                  f"{b / 2**20:>11.1f} {b / base['bytes'] if base['bytes'] else 0:>6.2f} {t / 2**20:>8.1f}")
    print("\n".join([
        "",
        "s/update: publish until every replica holds the version (object store: includes the replicas' 0.25 s poll);",
        "crit s: object store: put + the slowest replica's fetch and load; broadcast: the publish (stream, load,",
        "  acks; the object-store copy is put behind it);",
        "learner MiB: bytes out of the learner's side (broadcast: counted by the sender; object store: size x pulls);",
        "TCP MiB: measured on this process's TCP sockets (the broadcast's bytes plus Ray's own traffic).",
    ]))


if __name__ == "__main__":
    import json

    args = parse_args()
    rows = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    report(rows)
