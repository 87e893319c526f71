"""Weight handover between two processes on one GPU, as colocated placement needs it (rlscale/plan/
placement.py: the `ipc` transfer backend on GPUs, `shm` on the CPU).

ipc: this process (the learner's side) fills a bucket, exports it (torch's CUDA IPC handle through
torch.multiprocessing.reductions.reduce_tensor; on the CPU a multiprocessing.shared_memory segment), sends
the handle down a pipe; a second process (the engine's side) opens it, copies it into its own buffer,
checks two bytes and answers. Two buckets alternate, as a sender double-buffers. Timed per bucket, from
the send to the answer; the first bucket (the receiver's first open) is shown apart from the steady ones.
Predicted: the planner's handover_seconds (a device-memory copy at the profile's usable bandwidth).

nccl: two processes form an NCCL group on the same GPU. NCCL refuses it ("Duplicate GPU detected"), which
is why colocated placement cannot use the nccl backend; the check passes when NCCL refuses.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
from datetime import timedelta

from gpu_checks.common import row, short

ANSWER_TIMEOUT_S = 120.0  # one bucket's open and copy, or the receiver's start (imports torch, CUDA context)


# ----------------------------------------------------------------------------- the two sides of a bucket


def export_bucket(bucket, segment=None) -> tuple:
    """A picklable handle to `bucket`: CUDA IPC on a GPU, the shared-memory segment's name on the CPU."""
    if bucket.is_cuda:
        from torch.multiprocessing.reductions import reduce_tensor

        rebuild, args = reduce_tensor(bucket)
        return ("cuda", rebuild, args)
    return ("shm", segment.name, bucket.numel())


def open_bucket(handle: tuple):
    """(the sender's bucket as a tensor in this process, the shared-memory segment to close after use or None)."""
    import torch

    if handle[0] == "cuda":
        _, rebuild, args = handle
        return rebuild(*args), None
    from multiprocessing import shared_memory

    _, name, nbytes = handle
    segment = shared_memory.SharedMemory(name=name)
    return torch.frombuffer(segment.buf, dtype=torch.uint8, count=nbytes), segment


def receiver(conn, device: str, nbytes: int) -> None:
    """The engine's side: open each bucket, copy it into this process's buffer, answer with two of its bytes."""
    import torch

    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(0)
    dest = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    conn.send("ready")
    while (msg := conn.recv()) is not None:
        index, handle = msg
        t0 = time.perf_counter()
        src, segment = open_bucket(handle)
        t1 = time.perf_counter()
        dest.copy_(src)
        first, last = int(dest[0]), int(dest[-1])  # .item() waits for the copy
        t2 = time.perf_counter()
        del src
        if segment is not None:
            segment.close()
        conn.send((index, first, last, t1 - t0, t2 - t1))


def _answer(conn, what: str):
    if not conn.poll(ANSWER_TIMEOUT_S):
        raise TimeoutError(f"the receiving process did not answer {what} within {ANSWER_TIMEOUT_S:.0f} s")
    return conn.recv()


def handover_times(device: str, nbytes: int, buckets: int) -> dict:
    """Hand `buckets` buckets of `nbytes` to a second process; seconds per bucket and what arrived."""
    import torch

    ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
    conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=receiver, args=(child_conn, device, nbytes), daemon=True)
    segments, pair, bucket = [], [], None
    proc.start()
    try:
        if device == "cuda":
            pair = [torch.empty(nbytes, dtype=torch.uint8, device="cuda") for _ in range(2)]
        else:
            from multiprocessing import shared_memory

            segments = [shared_memory.SharedMemory(create=True, size=nbytes) for _ in range(2)]
            pair = [torch.frombuffer(seg.buf, dtype=torch.uint8, count=nbytes) for seg in segments]
        if _answer(conn, "ready") != "ready":
            raise RuntimeError("the receiving process did not start")
        seconds, opens, copies, wrong = [], [], [], []
        for i in range(buckets):
            bucket, value = pair[i % 2], i % 250 + 1
            bucket.fill_(value)
            if device == "cuda":
                torch.cuda.synchronize()  # the bucket is complete before its handle leaves
            handle = export_bucket(bucket, segments[i % 2] if segments else None)
            t0 = time.perf_counter()
            conn.send((i, handle))
            index, first, last, opened, copied = _answer(conn, f"bucket {i}")
            seconds.append(time.perf_counter() - t0)
            opens.append(opened)
            copies.append(copied)
            if (index, first, last) != (i, value, value):
                wrong.append(f"bucket {i}: got ({index}, {first}, {last}), expected ({i}, {value}, {value})")
        conn.send(None)
        proc.join(timeout=30)
        return {"seconds": seconds, "open_s": opens, "copy_s": copies, "wrong": wrong}
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        pair.clear()
        bucket = None  # noqa: F841  (the last view of a segment goes before the segment closes)
        for seg in segments:
            seg.close()
            seg.unlink()


def ipc_rows(s, measured: dict, planner, profile) -> list[dict]:
    """First bucket (shown), the steady buckets' GB/s (gated against the planner's handover), content."""
    nbytes, secs = s.ipc_bucket_bytes, measured["seconds"]
    predicted_s = None
    if planner is not None:
        usable = profile.memory_bandwidth * profile.bandwidth_efficiency
        predicted_s = planner.placement.handover_seconds(nbytes, usable)
    kind = "CUDA IPC" if s.device == "cuda" else "shared memory (the CPU stand-in)"
    size = f"{nbytes / 2**30:g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:g} MiB"
    steady = secs[1:] or secs
    mean = sum(steady) / len(steady)
    n = len(steady)
    opened, copied = sum(measured["open_s"][-n:]) / n, sum(measured["copy_s"][-n:]) / n
    pred_gbs = nbytes / predicted_s / 1e9 if predicted_s else None
    rows = [
        row("ipc", f"first {size} bucket ({kind}, receiver's first open)", "GB/s", nbytes / secs[0] / 1e9, pred_gbs,
            note=f"{secs[0] * 1e3:.2f} ms (open {measured['open_s'][0] * 1e3:.2f} ms)", seconds=secs[0]),
        row("ipc", f"steady {size} buckets x{len(steady)} ({kind})", "GB/s", nbytes / mean / 1e9, pred_gbs,
            gated=s.gated, note=f"{mean * 1e3:.2f} ms a bucket (fastest {min(steady) * 1e3:.2f}; the receiver's "
            f"open {opened * 1e3:.2f} ms, copy {copied * 1e3:.2f} ms); predicted: the planner's handover_seconds, "
            "a device copy at the profile's usable bandwidth", seconds=steady),
    ]
    rows.append(row("ipc", "bucket contents", "bytes checked", verdict="FAIL" if measured["wrong"] else "ok",
                    note="; ".join(measured["wrong"]) or f"first and last byte of all {len(secs)} buckets as sent"))
    return rows


def run_ipc(s, budget, planner, profile) -> list[dict]:
    if not budget.allows(30):
        return [row("ipc", "handover", "GB/s", verdict="skipped", note="time budget")]
    try:
        measured = handover_times(s.device, s.ipc_bucket_bytes, s.ipc_buckets)
    except Exception as exc:
        return [row("ipc", "handover", "GB/s", verdict="error", note=short(exc, 300))]
    return ipc_rows(s, measured, planner, profile)


# ----------------------------------------------------------------------------- NCCL on one GPU


def nccl_member(rank: int, port: int, answers, timeout_s: float) -> None:
    """One of two ranks that try to form an NCCL group on GPU 0 and all-reduce a tensor."""
    os.environ.setdefault("NCCL_DEBUG", "WARN")  # NCCL's own reason goes into the error text
    import torch
    import torch.distributed as dist

    try:
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                timeout=timedelta(seconds=timeout_s), device_id=torch.device("cuda", 0))
        t = torch.ones(1, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        answers.put((rank, "formed", f"all_reduce on one GPU gave {t.item():g}"))
    except Exception as exc:
        answers.put((rank, "refused", short(exc, 400)))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # already broken: the answer is sent
                pass


def nccl_verdict(answers: list[tuple], timeout_s: float, exitcodes: list | None = None) -> dict:
    """ok when both ranks were refused for a duplicate GPU; FAIL when the group formed, hung, or was refused
    for another reason (then it proves nothing about two processes on one GPU)."""
    item, why = "two-process NCCL group on one GPU", "why colocated placement hands weights over by CUDA IPC"
    if len(answers) < 2:
        return row("nccl", item, "refused", verdict="FAIL", note=f"{2 - len(answers)} rank(s) neither formed the "
                   f"group nor were refused within {timeout_s:.0f} s (hung, or died: exit codes {exitcodes}): "
                   f"{answers}")
    formed = [a for a in answers if a[1] == "formed"]
    if formed:
        return row("nccl", item, "refused", verdict="FAIL", note="NCCL formed the group (" + formed[0][2] + "): the "
                   "premise of the ipc backend for colocated engines (rlscale/plan/placement.py) is wrong; revisit it")
    texts = [a[2] for a in sorted(answers)]
    if all("duplicate" in t.lower() for t in texts):
        return row("nccl", item, "refused", verdict="ok", note=f"NCCL refused, as expected ({why}): {texts[0]}")
    return row("nccl", item, "refused", verdict="FAIL",
               note=f"refused, but not for a duplicate GPU, so this proves nothing: {' | '.join(texts)}")


def run_nccl(s, budget) -> list[dict]:
    if not budget.allows(30):
        return [row("nccl", "two-process NCCL group on one GPU", "refused", verdict="skipped", note="time budget")]
    ctx = mp.get_context("spawn")
    answers = ctx.Queue()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [ctx.Process(target=nccl_member, args=(r, port, answers, s.nccl_timeout_s), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    got, deadline = [], time.monotonic() + s.nccl_timeout_s + 30
    try:
        while len(got) < 2 and time.monotonic() < deadline:
            try:
                got.append(answers.get(timeout=max(0.1, deadline - time.monotonic())))
            except Exception:  # queue.Empty at the deadline
                break
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return [nccl_verdict(got, s.nccl_timeout_s, [p.exitcode for p in procs])]
