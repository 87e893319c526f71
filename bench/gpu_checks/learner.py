"""rlscale's DeepSpeed learner on one GPU against the planner, and DeepSpeed's offload_states / reload_states.

A random-initialised model of the learner shape is saved once; each config (ZeRO-1 and 3, gradient
checkpointing off and on) runs in a process of its own (learner_worker.py: a fresh allocator, a fresh
process group). Predictions come from the planner's public model (SystemModel.train_seconds,
learner_memory, activation_bytes_per_token, micro_batch_tokens_max; offload_seconds, each way, for the
host copies), so a corrected constant in rlscale/plan shows here without a change.

Where DeepSpeed or rlscale.trainer.learner cannot be imported (wheels not carried), a plain torch step
that mirrors the learner's (the GRPO loss's forward and backward, AdamW on fp32 master weights under bf16
autocast) runs instead and the rows say so.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpu_checks.common import MODELS, build_model, free, gb, planner_shape, row, short, sync, system_model

WORKER = Path(__file__).with_name("learner_worker.py")


def configs(s, learner: bool, offload: bool) -> list[dict]:
    """ZeRO stage x checkpointing; offload rides on the checkpointing-off runs (it needs a learner's states)."""
    out = []
    for z in s.learner_stages:
        for gc in (False, True) if learner else (False,):
            out.append({"zero_stage": z, "gc": gc, "offload": offload and not gc})
    return out


def label(cfg: dict) -> str:
    return f"ZeRO-{cfg['zero_stage']}, checkpointing {'on' if cfg['gc'] else 'off'}"


# ----------------------------------------------------------------------------- the planner's numbers


def predictions(s, planner, profile, cfg: dict) -> dict:
    """What the planner says of this learner step on one device: seconds, state bytes, activation bytes of
    one micro-batch, and the gradient bytes among the state (freed between steps, so not resident)."""
    shape = planner_shape(planner, s.learner_model)
    model, dropped = system_model(planner, shape, profile, s.dtype, prompt_tokens=s.learner_prompt,
                                  response_tokens=s.learner_response, max_new_tokens=s.learner_response,
                                  zero_stage=cfg["zero_stage"], micro_batch=s.learner_micro_batch,
                                  gradient_checkpointing=cfg["gc"], learner_gpus=1)
    seconds = model.train_seconds(s.learner_samples, 1)
    state = model.learner_memory(1)
    activations = model.activation_bytes_per_token() * model.micro_batch_tokens_max()
    grads = shape.params * planner.shapes.DTYPE_BYTES[s.dtype]
    host = profile.host_bandwidth
    return {"seconds": seconds, "tokens_per_s": s.learner_samples * (s.learner_prompt + s.learner_response) / seconds,
            "state": state, "activations": activations, "grads": grads, "peak": state + activations,
            "resident": state - grads, "host_copy_s": (state - grads) / host,  # one way of SystemModel.offload_seconds
            "host_bandwidth": host, "dropped": dropped}


# ----------------------------------------------------------------------------- rows


def params_text(n: float) -> str:
    return f"{n / 1e9:.2f}B params" if n >= 1e8 else f"{n:,.0f} params"


def learner_rows(s, cfg: dict, m: dict, p: dict | None, note: str = "") -> list[dict]:
    """tokens/s, the step's peak, the activations and the resident states, each against the planner."""
    item, g = label(cfg), s.gated
    p = p or {}
    if "error" in m:
        fits = p.get("peak") is not None and m.get("device_total") and p["peak"] < m["device_total"]
        verdict = "MISS" if m.get("oom") and fits else "skipped" if m.get("oom") else "error"
        why = " (the planner said it fits)" if verdict == "MISS" else ""
        return [row("learner", item, "tokens/s", verdict=verdict, note=f"{m['error']}{why}")]
    step = sum(m["step_s"]) / len(m["step_s"])
    rows = [row("learner", item, "tokens/s", m["tokens"] / step, p.get("tokens_per_s"), gated=g,
                note=f"{step:.3f} s a step of {m['tokens']:,} tokens (warm-up {m['warmup_s']:.1f} s, init "
                f"{m.get('init_s', 0):.0f} s), {params_text(m['params'])}{note}", **m)]
    peak, resident = m.get("peak_bytes"), m.get("resident_bytes")
    if peak is None:
        rows.append(row("learner", item, "peak GB", verdict="n/a", note="no allocator statistics on the CPU"))
        return rows
    act = peak - resident - p["grads"] if p else None
    rows += [
        row("learner", item, "peak GB", gb(peak), gb(p.get("peak")), gated=g,
            note="the allocator's peak in a step; planner: learner_memory + activations of one micro-batch"),
        row("learner", item, "activation GB", gb(act), gb(p.get("activations")), gated=g,
            note="peak above what stays allocated between steps, less the planner's gradient bytes; planner: "
            "activation_bytes_per_token x micro_batch_tokens_max"),
        row("learner", item, "resident GB", gb(resident), gb(p.get("resident")), gated=g,
            note="allocated between steps (weights, fp32 master, Adam); planner: learner_memory less gradients"),
    ]
    return rows


def offload_rows(s, cfg: dict, off: dict, p: dict | None) -> list[dict]:
    """The steady (last) cycle against the planner (the first also pins the host buffers, shown apart).
    Where DeepSpeed refused to offload the optimizer's states, a FAIL row says so and the figures are those
    of the partial offload, against the planner's bytes of the weights alone."""
    item, g, p = label(cfg), s.gated, p or {}
    if "error" in off:
        return [row("offload", item, "offload_states", verdict="error", note=off["error"])]
    rows, resident, host_s = [], p.get("resident"), p.get("host_copy_s")
    if off.get("refused"):
        rows.append(row("offload", item, "optimizer states offloaded", verdict="FAIL",
                        note=f"offload_states refused them ({off['refused']}): at ZeRO-3 DeepSpeed offloads the fp32 "
                        "master weights and Adam's state only for its FusedAdam, and the learner runs torch's AdamW "
                        "(torch_adam, trainer/learner.py), so a colocated ZeRO-3 learner keeps them on the GPU; "
                        f"below: {', '.join(off['partial'])} only, against the weights' bytes"))
        resident = p.get("grads")  # the bf16 weights: params x dtype bytes, the same count as the gradients
        host_s = resident / p["host_bandwidth"] if resident else None
    what = "the weights' bytes" if off.get("refused") else "learner_memory less gradients"
    first, last = off["cycles"][0], off["cycles"][-1]
    host = f"planner: offload_seconds' one way at host_bandwidth {p['host_bandwidth'] / 1e9:g} GB/s" if p else ""
    freed = last.get("freed_allocated")
    if freed is None:
        freed_note, back = "no allocator statistics on the CPU (the calls ran, host to host)", ""
    else:
        freed_note = (f"allocated before - after offload_states + empty_cache (reserved freed "
                      f"{last['freed_reserved'] / 1e9:.1f} GB); planner: {what}")
        back = f"; {last['restored'] / 1e9:.1f} GB back"
    return rows + [
        row("offload", item, "freed GB", gb(freed), gb(resident), gated=g, note=freed_note),
        row("offload", item, "offload s", last["offload_s"], host_s, gated=g,
            note=f"first cycle {first['offload_s']:.2f} s (pins the host buffers); {host}"),
        row("offload", item, "reload s", last["reload_s"], host_s, gated=g,
            note=f"first cycle {first['reload_s']:.2f} s{back}"),
        row("offload", item, "trains after reload", verdict="ok" if off["trains_after_reload"] else "FAIL",
            note=f"loss {off['loss_after_reload']}"),
    ]


# ----------------------------------------------------------------------------- running the worker


def save_model(s, folder: Path) -> Path:
    import torch

    model = build_model(s.learner_model, getattr(torch, s.dtype), s.device)
    path = folder / s.learner_model
    model.save_pretrained(path, safe_serialization=True)
    del model
    free(s.device)
    return path


def worker_env(device: str) -> dict:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               PYTHONUNBUFFERED="1")
    if device == "cpu":
        env.update(CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu")
    return env


def run_worker(s, model_path: Path, cfgs: list[dict], timeout: float, folder: Path) -> tuple[list[dict], str | None]:
    """(one result per config, the import error if the learner could not be imported there)."""
    args = {"model_path": str(model_path), "device": s.device, "dtype": s.dtype, "configs": cfgs,
            "micro_batch": s.learner_micro_batch, "samples": s.learner_samples, "prompt": s.learner_prompt,
            "response": s.learner_response, "steps": s.learner_steps, "vocab": MODELS[s.learner_model]["vocab_size"],
            "threads": 2 if s.device == "cpu" else 4}
    path = folder / f"args-{time.monotonic_ns()}.json"
    path.write_text(json.dumps(args))
    try:
        proc = subprocess.run([sys.executable, str(WORKER), str(path)], env=worker_env(s.device), text=True,
                              capture_output=True, timeout=max(timeout, 10))
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        done = [json.loads(x[7:]) for x in out.splitlines() if x.startswith("RESULT ")]
        return done + [{**c, "error": f"time budget: killed after {timeout:.0f} s"} for c in cfgs[len(done):]], None
    for line in proc.stdout.splitlines():
        if line.startswith("IMPORT_ERROR "):
            return [], json.loads(line[13:])["error"]
    done = [json.loads(x[7:]) for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    tail = " ".join((proc.stderr or proc.stdout)[-600:].split())
    return done + [{**c, "error": f"worker exited {proc.returncode}: {tail}"} for c in cfgs[len(done):]], None


def run(s, budget, planner, profile, learner: bool = True, offload: bool = True) -> list[dict]:
    cfgs = configs(s, learner, offload)
    if not budget.allows(60):
        return [row("learner", label(c), "tokens/s", verdict="skipped", note="time budget") for c in cfgs]
    folder = Path(tempfile.mkdtemp(prefix="gpu-check-learner-"))
    rows: list[dict] = []
    try:
        model_path = save_model(s, folder)
        # On a GPU a process per config; the CPU smoke runs them all in one (each start imports DeepSpeed).
        groups = [[c] for c in cfgs] if s.device == "cuda" else [cfgs]
        for group in groups:
            if not budget.allows(30):
                rows += [row("learner", label(c), "tokens/s", verdict="skipped", note="time budget") for c in group]
                continue
            results, import_error = run_worker(s, model_path, group, budget.left() + 30, folder)
            if import_error:
                return rows + plain_rows(s, planner, profile, import_error)
            for cfg, m in zip(group, results, strict=True):
                p = predictions(s, planner, profile, cfg) if planner else None
                rows += learner_rows(s, cfg, m, p)
                if "offload" in m:
                    rows += offload_rows(s, cfg, m["offload"], p)
                print(f"gpu-check: learner {label(cfg)}: {m.get('error') or 'done'}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return rows


# ----------------------------------------------------------------------------- without DeepSpeed


def plain_step(model, opt, ids, adv, amp_dtype) -> None:
    """The learner's step without DeepSpeed: the clipped-ratio loss's forward and backward (one epoch, one
    mini-batch: the old log-probs are the detached forward's, as trainer/updates.py does), then AdamW."""
    import torch

    ctx = torch.autocast("cuda", dtype=amp_dtype) if amp_dtype is not None else contextlib.nullcontext()
    with ctx:
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    loss = -torch.minimum(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def plain_rows(s, planner, profile, why: str) -> list[dict]:
    """The plain torch step, checkpointing off and on, in this process."""
    import torch

    rows = []
    note = f"; DeepSpeed learner not importable ({why}): a plain torch AdamW step instead, no ZeRO"
    for gc in (False, True):
        cfg = {"zero_stage": 0, "gc": gc}
        free(s.device)
        model = build_model(s.learner_model, torch.float32, s.device, gc=gc).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        gen = torch.Generator(device=s.device).manual_seed(0)
        seq = s.learner_prompt + s.learner_response
        ids = torch.randint(4, model.config.vocab_size, (s.learner_micro_batch, seq), device=s.device, generator=gen)
        adv = torch.randn(s.learner_micro_batch, 1, device=s.device, generator=gen)
        amp = torch.bfloat16 if s.device == "cuda" else None
        try:
            t0 = time.perf_counter()
            plain_step(model, opt, ids, adv, amp)  # warm-up; allocates Adam's state
            sync(s.device)
            warm = time.perf_counter() - t0
            resident = torch.cuda.memory_allocated() if s.device == "cuda" else None
            if s.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            plain_step(model, opt, ids, adv, amp)
            sync(s.device)
            m = {"step_s": [time.perf_counter() - t0], "warmup_s": warm, "tokens": s.learner_micro_batch * seq,
                 "params": sum(p.numel() for p in model.parameters()), "resident_bytes": resident,
                 "peak_bytes": torch.cuda.max_memory_allocated() if s.device == "cuda" else None}
        except torch.cuda.OutOfMemoryError as exc:
            m = {"error": short(exc, 120), "oom": True}
        finally:
            del model, opt
        # one micro-batch a step here: the planner's model of the same
        p = None
        if planner is not None:
            q = s.__class__(**{**s.__dict__, "learner_samples": s.learner_micro_batch})
            p = predictions(q, planner, profile, {"zero_stage": 1, "gc": gc})
        rows += learner_rows(s, cfg, m, p, note)
    return rows
