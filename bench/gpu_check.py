"""GPU check (`make gpu-check`): the checks that decide whether rlscale's GPU path works, each measured next
to the planner's prediction (docs/gpu.md, "make gpu-check"; the checks are in bench/gpu_checks/):

  driver   cuInit through ctypes on libcuda.so.1, the driver's CUDA version, the GPU preflight's verdict
  ipc      CUDA IPC handover of 1 GiB buckets between two processes (GB/s)
  nccl     a two-process NCCL group on one GPU, which NCCL must refuse (why colocated uses IPC)
  learner  rlscale's DeepSpeed learner (ZeRO-1 and 3, checkpointing off and on): tokens/s, memory
  offload  DeepSpeed offload_states / reload_states: seconds and the memory freed
  decode   HF decode tokens/s at concurrency 1/8/64/256 on Qwen2.5-1.5B and 7B shapes (roofline, planner)

Each row prints measured, predicted and their ratio; a gated row more than 2x off either way, or a check
that fails or errors, makes the run exit 1 with a FAILED line. Writes gpu-check.json and gpu-check.md to
$OUT (or --out), else bench/out/. Needs torch and transformers; the learner and offload checks need
DeepSpeed (docs/gpu.md names the wheels to carry). Without a GPU it says so, lists the checks and exits 0;
--cpu-smoke runs every check that can run on the CPU with tiny shapes (IPC through shared memory).

    python bench/gpu_check.py                  # or: make gpu-check  (under 10 min on one H100)
    python bench/gpu_check.py --cpu-smoke      # the checks' code on the CPU
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
import traceback

from gpu_checks import common, decode, driver, handover, learner
from gpu_checks.common import CHECKS, DESCRIPTIONS, NEEDS_GPU, Budget, Settings, row
from gpu_checks.report import markdown, write


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU, the checks that can run there")
    p.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated subset of {', '.join(CHECKS)}")
    p.add_argument("--profile", default="auto", help="planner profile (default: from the GPU's name, else H100)")
    p.add_argument("--models", default="qwen2.5-1.5b,qwen2.5-7b", help="decode models")
    p.add_argument("--concurrency", default="1,8,64,256", help="decode concurrencies")
    p.add_argument("--learner-model", default="qwen2.5-1.5b",
                   help="the learner's shape (7B on one GPU needs ~122 GB of states alone)")
    p.add_argument("--ipc-buckets", type=int, default=8, help="1 GiB buckets handed over (the first apart)")
    p.add_argument("--budget-s", type=float, default=480.0,
                   help="nothing starts after this many seconds; the run ends within about a minute of it")
    p.add_argument("--out", default=os.environ.get("OUT"), help="report folder (default $OUT, else bench/out)")
    a = p.parse_args(argv)
    unknown = [c for c in a.checks.split(",") if c and c not in CHECKS]
    if unknown:
        p.error(f"--checks: {', '.join(unknown)} unknown; use some of {', '.join(CHECKS)}")
    return a


def settings(a, device_name: str) -> Settings:
    checks = [c for c in CHECKS if c in a.checks.split(",")]
    if a.cpu_smoke:
        return common.cpu_smoke_settings(checks)
    models = a.models.split(",")
    for m in models + [a.learner_model]:
        if m not in common.QWEN25:
            raise SystemExit(f"gpu-check: model {m!r} unknown; use one of {', '.join(common.QWEN25)}")
    return Settings("cuda", "bfloat16", common.profile_for(device_name, a.profile), checks, gated=True,
                    budget_s=a.budget_s, decode_models=models, concurrency=[int(c) for c in a.concurrency.split(",")],
                    ipc_buckets=a.ipc_buckets, learner_model=a.learner_model)


def version(name: str) -> str:
    """The installed distribution's version, without importing it (DeepSpeed's import takes seconds)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def environment(device: str) -> dict:
    import torch

    name = torch.cuda.get_device_name(0) if device == "cuda" else f"CPU smoke ({platform.processor() or 'cpu'})"
    return {"device_name": name, "torch": torch.__version__, "transformers": version("transformers"),
            "deepspeed": version("deepspeed"), "cuda": torch.version.cuda, "python": platform.python_version()}


def run_checks(s: Settings, budget: Budget, planner, profile) -> list[dict]:
    runners = {
        "driver": lambda: driver.run(s, budget),
        "ipc": lambda: handover.run_ipc(s, budget, planner, profile),
        "nccl": lambda: handover.run_nccl(s, budget),
        "learner": lambda: learner.run(s, budget, planner, profile, learner="learner" in s.checks,
                                       offload="offload" in s.checks and s.device == "cuda"),
        "decode": lambda: decode.run(s, budget, planner, profile),
    }
    rows: list[dict] = []
    for check in s.checks:
        if s.device == "cpu" and check in NEEDS_GPU:
            rows.append(row(check, DESCRIPTIONS[check], "", verdict="needs a GPU", note="not run on the CPU"))
            continue
        if check == "offload" and "learner" in s.checks:
            continue  # runs inside the learner's processes
        name = "learner" if check == "offload" else check
        print(f"gpu-check: {check} ({budget.elapsed():.0f} s)", file=sys.stderr, flush=True)
        try:
            rows += runners[name]()
        except Exception as exc:
            rows.append(row(check, "check", "", verdict="error", note=common.short(exc, 300),
                            traceback=traceback.format_exc()[-3000:]))
        common.free(s.device)  # what this process cached goes back before the next check's processes start
    return rows


def no_gpu_text(why: str) -> str:
    lines = [f"gpu-check: no GPU here ({why}); nothing measured, exit 0. On a GPU machine it would run:"]
    lines += [f"  {c:8} {DESCRIPTIONS[c]}" for c in CHECKS]
    lines.append("Run it on a GPU machine (docs/gpu.md, \"make gpu-check\"), or with --cpu-smoke for the checks' "
                 "code on the CPU (IPC through shared memory, the DeepSpeed learner on a tiny model).")
    return "\n".join(lines)


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        import torch
    except ImportError:
        print(no_gpu_text("torch is not installed"))
        return 0
    if not a.cpu_smoke and not torch.cuda.is_available():
        print(no_gpu_text("torch.cuda.is_available() is False"))
        return 0
    device_name = torch.cuda.get_device_name(0) if not a.cpu_smoke else "cpu"
    s = settings(a, device_name)
    budget = Budget(s.budget_s)
    planner, note = common.import_planner()
    notes = [note] if note else []
    profile = planner.profiles.PROFILES[s.profile] if planner else None
    if s.device == "cpu":
        torch.set_num_threads(min(2, os.cpu_count() or 1))
    env = environment(s.device)
    rows = run_checks(s, budget, planner, profile)
    notes.append(f"wall {budget.elapsed():.0f} s of a {s.budget_s:.0f} s budget")
    text = markdown(s, env, rows, notes)
    path = write(text, {"env": env, "settings": s.__dict__, "rows": rows, "notes": notes}, a.out)
    print(text)
    print(f"gpu-check: written to {path}")
    bad = common.failures(rows)
    if bad:
        listed = "; ".join(f"{r['check']} {r['item']} {r['metric']}: {r['verdict']}" for r in bad)
        line = f"gpu-check: FAILED: {len(bad)} row(s) missed or failed: {listed}"
        print(line)
        print(line, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
