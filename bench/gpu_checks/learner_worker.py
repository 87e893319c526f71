"""One process of the learner check (bench/gpu_checks/learner.py starts it): rlscale's own DeepSpeed
learner (rlscale.trainer.learner.Learner, a single rank) built for each config in turn, one warm-up step,
then timed steps with the CUDA allocator's peak; optionally DeepSpeed's offload_states / reload_states
twice and one more step after the reload. Prints `RESULT {json}` per config, or `IMPORT_ERROR {json}`
when the learner cannot be imported here (the parent then runs its plain torch step instead).

    python bench/gpu_checks/learner_worker.py ARGS_JSON   # RANK/WORLD_SIZE/MASTER_* in the environment
"""

from __future__ import annotations

import gc
import json
import math
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (str(ROOT / "bench"), str(ROOT)):
    if p not in sys.path:
        sys.path.append(p)


def make_batch(samples: int, group: int, prompt: int, response: int, vocab: int) -> dict:
    """Full-length sequences (every micro-batch has micro_batch x (prompt + response) tokens, as the planner
    assumes), groups of `group` samples whose rewards alternate 0/1, so no group is dropped as uniform."""
    rng = random.Random(0)
    prompts, responses, rewards = [], [], []
    for i in range(samples):
        if i % group == 0:
            p = [rng.randrange(4, vocab) for _ in range(prompt)]
        prompts.append(p)
        responses.append([rng.randrange(4, vocab) for _ in range(response)])
        rewards.append(float(i % 2))
    return {"prompt_ids": prompts, "response_ids": responses, "rewards": rewards, "samples_per_prompt": group}


def memory(device: str) -> dict:
    import torch

    if device != "cuda":
        return {"allocated": None, "reserved": None, "peak": None}
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
            "peak": torch.cuda.max_memory_allocated()}


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def timed_steps(learner, batch: dict, steps: int, device: str) -> dict:
    """One warm-up step (it allocates Adam's state), then `steps` timed ones; the allocator's peak over them
    and what stays allocated between steps."""
    import torch

    t0 = time.perf_counter()
    learner.step(batch)
    sync(device)
    warmup = time.perf_counter() - t0
    resident = memory(device)["allocated"]
    seconds, last = [], {}
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        t0 = time.perf_counter()
        last = learner.step(batch)
        sync(device)
        seconds.append(time.perf_counter() - t0)
    if last.get("skipped"):
        raise RuntimeError(f"the learner skipped the step (no reward signal): {last}")
    return {"warmup_s": warmup, "step_s": seconds, "resident_bytes": resident, "peak_bytes": memory(device)["peak"],
            "loss": last.get("loss"), "grad_norm": last.get("grad_norm")}


# What offload_states moves when it refuses the optimizer's states (ZeRO-3 with torch's AdamW, below).
PARTIAL = ("lp_params", "lp_grads", "contiguous_grad_buffer")


def offload_once(engine, include):
    """offload_states of everything (include None), or of `include`. At ZeRO-3 DeepSpeed offloads the fp32
    master weights and Adam's state only for its own FusedAdam (an assertion in stage3.offload_states, raised
    before anything moves); the learner runs torch's AdamW, so then the rest is offloaded and the refusal
    returned."""
    from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum

    if include is None:
        try:
            engine.offload_states()
            return None, None
        except AssertionError as exc:
            include = [OffloadStateTypeEnum(x) for x in PARTIAL]
            engine.offload_states(include=include)
            return include, " ".join(str(exc).split())
    engine.offload_states(include=include)
    return include, None


def offload_cycles(learner, batch: dict, device: str, cycles: int = 2) -> dict:
    """offload_states, then torch.cuda.empty_cache() (the colocated order, issue 40 item 2), then
    reload_states: seconds and bytes freed per cycle; the first pins the host buffers, later ones reuse
    them. Then one step, which must still train (a finite loss). On the CPU the same calls run (DeepSpeed's
    CPU accelerator copies host to host), which tests the calls, not the figures."""
    import torch

    def empty_cache():
        if device == "cuda":
            torch.cuda.empty_cache()

    engine, out, include, refused = learner.engine, [], None, None
    for _ in range(cycles):
        sync(device)
        empty_cache()
        before = memory(device)
        t0 = time.perf_counter()
        include, why = offload_once(engine, include)
        refused = refused or why
        sync(device)
        off = time.perf_counter() - t0
        empty_cache()
        offloaded = memory(device)
        t0 = time.perf_counter()
        engine.reload_states()
        sync(device)
        cycle = {"offload_s": off, "reload_s": time.perf_counter() - t0}
        if device == "cuda":
            cycle.update(freed_allocated=before["allocated"] - offloaded["allocated"],
                         freed_reserved=before["reserved"] - offloaded["reserved"],
                         restored=memory(device)["allocated"] - offloaded["allocated"])
        out.append(cycle)
    stats = learner.step(batch)
    loss = stats.get("loss")
    return {"cycles": out, "loss_after_reload": loss, "trains_after_reload": loss is not None and math.isfinite(loss),
            "refused": refused, "partial": [str(x.value) for x in include] if include else None}


def param_count(module) -> int:
    # ZeRO-3 leaves each parameter an empty placeholder; ds_numel is its full size
    return sum(int(getattr(p, "ds_numel", p.numel())) for p in module.parameters())


def one(cfg: dict, args: dict, Learner, LearnerConfig) -> dict:
    import torch

    device = args["device"]
    out = {"zero_stage": cfg["zero_stage"], "gradient_checkpointing": cfg["gc"]}
    learner = None
    try:
        t0 = time.perf_counter()
        learner = Learner(LearnerConfig(model_path=args["model_path"], dtype=args["dtype"],
                                        zero_stage=cfg["zero_stage"], micro_batch=args["micro_batch"],
                                        gradient_checkpointing=cfg["gc"], lr=1e-6, seed=0))
        out["init_s"] = time.perf_counter() - t0
        out["params"] = param_count(learner.engine.module)
        batch = make_batch(args["samples"], args["micro_batch"], args["prompt"], args["response"], args["vocab"])
        out["tokens"] = args["samples"] * (args["prompt"] + args["response"])
        out.update(timed_steps(learner, batch, args["steps"], device))
        if cfg.get("offload"):
            try:
                out["offload"] = offload_cycles(learner, batch, device)
            except Exception as exc:  # the learner's rows stand; the offload row says what failed
                out["offload"] = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"}
        if device == "cuda":
            out["device_total"] = torch.cuda.get_device_properties(0).total_memory
    except torch.cuda.OutOfMemoryError as exc:
        out["error"], out["oom"] = " ".join(str(exc).split())[:200], True
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
    finally:
        if learner is not None:
            learner.shutdown()
        del learner
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def main() -> int:
    args = json.loads(Path(sys.argv[1]).read_text())
    import torch

    torch.set_num_threads(int(args.get("threads", 2)))
    try:
        from gpu_checks.common import map_trainer_package

        map_trainer_package()
        import deepspeed  # noqa: F401  (the learner imports it lazily; fail here with its name)

        from rlscale.trainer.learner import Learner, LearnerConfig
    except ImportError as exc:
        print("IMPORT_ERROR " + json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 0
    for cfg in args["configs"]:
        print("RESULT " + json.dumps(one(cfg, args, Learner, LearnerConfig)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
