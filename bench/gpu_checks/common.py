"""What every check shares: the settings, result rows and the 2x gate, the planner, models, devices."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
import types
from dataclasses import dataclass, field, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

# The checks in the order they run: the quick ones that decide the GPU path first, decode last.
CHECKS = ("driver", "ipc", "nccl", "learner", "offload", "decode")
DESCRIPTIONS = {
    "driver": "driver and cuInit through ctypes on libcuda.so.1, and the GPU preflight's verdict",
    "ipc": "CUDA IPC handover of 1 GiB buckets between two processes, GB/s against the planner's on-GPU handover",
    "nccl": "a two-process NCCL group on one GPU, which NCCL must refuse (why colocated uses IPC)",
    "learner": "rlscale's DeepSpeed learner on Qwen2.5-1.5B (ZeRO-1 and 3, checkpointing off and on): "
               "tokens/s, peak and activation bytes against the planner",
    "offload": "DeepSpeed offload_states / reload_states: seconds and the memory freed, against the planner",
    "decode": "HF decode tokens/s at concurrency 1/8/64/256 on Qwen2.5-1.5B and 7B shapes against the "
              "roofline and the planner",
}
NEEDS_GPU = ("driver", "nccl", "offload")  # what --cpu-smoke lists instead of running
MISS_FACTOR = 2.0  # a gated measurement more than this far from its prediction, either way, fails the run

# Qwen2.5 configs as published on the hub (config.json), written out: no network on the GPU machine.
QWEN25 = {
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
TINY = {"tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=1, vocab_size=512, tie_word_embeddings=True)}
MODELS = {**QWEN25, **TINY}


@dataclass
class Settings:
    device: str  # cuda, or cpu for --cpu-smoke
    dtype: str  # the planner's name: bfloat16 / float32
    profile: str  # planner profile name
    checks: list[str]
    gated: bool  # the 2x gate applies (on a GPU; a CPU smoke only shows the ratios)
    budget_s: float
    decode_models: list[str] = field(default_factory=lambda: ["qwen2.5-1.5b", "qwen2.5-7b"])
    concurrency: list[int] = field(default_factory=lambda: [1, 8, 64, 256])
    prompt_tokens: int = 64
    decode_steps: int = 32
    warmup_steps: int = 3
    ipc_bucket_bytes: int = 1 << 30
    ipc_buckets: int = 8
    nccl_timeout_s: float = 90.0
    learner_model: str = "qwen2.5-1.5b"
    learner_stages: list[int] = field(default_factory=lambda: [1, 3])
    learner_micro_batch: int = 4  # sequences per micro-batch
    learner_samples: int = 8  # sequences per step (two micro-batches)
    learner_prompt: int = 512
    learner_response: int = 512
    learner_steps: int = 2  # timed steps after one warm-up step


def cpu_smoke_settings(checks: list[str]) -> Settings:
    """Tiny shapes on the CPU: every line of the checks' code that can run without a GPU, in seconds."""
    return Settings("cpu", "float32", "cpu", checks, gated=False, budget_s=600.0, decode_models=["tiny"],
                    concurrency=[1, 2], prompt_tokens=8, decode_steps=4, warmup_steps=1,
                    ipc_bucket_bytes=4 << 20, ipc_buckets=4, learner_model="tiny", learner_micro_batch=2,
                    learner_samples=4, learner_prompt=8, learner_response=8, learner_steps=1)


def profile_for(device_name: str, asked: str) -> str:
    """The planner profile of this GPU: --profile when given, else the one its name contains (H100, H200...)."""
    if asked != "auto":
        return asked
    for name in ("H200", "H100", "A100", "L4"):
        if name in device_name:
            return "A100-80GB" if name == "A100" else name
    return "H100"


class Budget:
    """The run's time budget: checks ask before they start something, and subprocesses get what is left."""

    def __init__(self, seconds: float):
        self.seconds, self.started = seconds, time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def allows(self, estimate_s: float = 0.0) -> bool:
        return self.left() > estimate_s


# ----------------------------------------------------------------------------- result rows and the gate


def row(check: str, item: str, metric: str, measured=None, predicted=None, gated: bool = False, note: str = "",
        verdict: str | None = None, **extra) -> dict:
    """One line of the report: measured against predicted. The verdict, unless given: `ok` or `MISS` for a
    gated row (MISS: more than MISS_FACTOR off, either way), `info` for an ungated one, `n/a` without both."""
    ratio = measured / predicted if measured is not None and predicted else None
    if verdict is None:
        if ratio is None:
            verdict = "n/a"
        elif not gated:
            verdict = "info"
        else:
            verdict = "ok" if 1.0 / MISS_FACTOR <= ratio <= MISS_FACTOR else "MISS"
    return {"check": check, "item": item, "metric": metric, "measured": measured, "predicted": predicted,
            "ratio": ratio, "gated": gated, "verdict": verdict, "note": note, **extra}


FAILING = ("MISS", "FAIL", "error")


def failures(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["verdict"] in FAILING]


# ----------------------------------------------------------------------------- the planner


PLANNER_MODULES = ("rlscale.plan.throughput", "rlscale.plan.profiles", "rlscale.plan.shapes",
                   "rlscale.plan.placement")


def import_planner():
    """rlscale.plan's throughput, profiles, shapes and placement modules, or (None, why). They need only the
    standard library; should the package's __init__ fail to import (a dependency the GPU machine lacks),
    they are loaded under a bare package stub instead."""
    try:
        mods = {n.rsplit(".", 1)[1]: importlib.import_module(n) for n in PLANNER_MODULES}
        return types.SimpleNamespace(**mods), None
    except ImportError as first:
        for name in [m for m in sys.modules if m == "rlscale.plan" or m.startswith("rlscale.plan.")]:
            del sys.modules[name]
        stub = types.ModuleType("rlscale.plan")
        stub.__path__ = [str(ROOT / "rlscale" / "plan")]
        sys.modules["rlscale.plan"] = stub
        try:
            mods = {n.rsplit(".", 1)[1]: importlib.import_module(n) for n in PLANNER_MODULES}
            return types.SimpleNamespace(**mods), f"rlscale.plan loaded without its package ({first})"
        except Exception as exc:  # the predictions are left out; the measurements stand
            del sys.modules["rlscale.plan"]
            return None, f"predictions left out: cannot import rlscale.plan ({type(exc).__name__}: {exc})"


def planner_shape(planner, name: str):
    return planner.shapes.shape_from_config({"model_type": "qwen2", **MODELS[name]}, source=f"gpu_check:{name}")


def system_model(planner, shape, profile, dtype: str, **kw):
    """The planner's SystemModel; options this checkout's planner does not know are dropped (and named)."""
    sm = planner.throughput.SystemModel
    known = {f.name for f in fields(sm)}
    dropped = sorted(k for k in kw if k not in known)
    return sm(shape=shape, profile=profile, dtype=dtype, **{k: v for k, v in kw.items() if k in known}), dropped


def map_trainer_package() -> None:
    """rlscale.trainer lives in trainer/ (pyproject's package-dir); on a machine where the checkout is not
    installed (the GPU machine), map it by hand so `rlscale.trainer.learner` imports from the checkout."""
    if "rlscale.trainer" in sys.modules or importlib.util.find_spec("rlscale") is None:
        return
    try:
        if importlib.util.find_spec("rlscale.trainer") is not None:
            return
    except ImportError:
        pass
    spec = importlib.util.spec_from_file_location("rlscale.trainer", ROOT / "trainer" / "__init__.py",
                                                  submodule_search_locations=[str(ROOT / "trainer")])
    module = importlib.util.module_from_spec(spec)
    sys.modules["rlscale.trainer"] = module
    spec.loader.exec_module(module)


# ----------------------------------------------------------------------------- models and devices


def build_model(name: str, dtype, device: str, gc: bool = False):
    """A random-initialised Qwen2 causal LM of the named shape, built directly on `device`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**MODELS[name], max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
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


def gb(v: float | None) -> float | None:
    return None if v is None else v / 1e9


def short(exc: BaseException, limit: int = 160) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}"
