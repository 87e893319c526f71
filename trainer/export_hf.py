"""`rlscale export RUN --hf OUT`: a Hugging Face model directory from a run's newest complete checkpoint.

A checkpoint holds DeepSpeed state (trainer/checkpoint.py): at ZeRO 0 the module's weights in
`mp_rank_00_model_states.pt`; at ZeRO 1-3 the fp32 master weights partitioned over the ranks'
`*optim_states.pt` files, which DeepSpeed's own converter joins. The weights written are those
master weights cast to the run's dtype, which is what the learner's module (and so every rollout
engine) held at that step. With one checkpoint volume per rank (Kubernetes without a shared
`checkpoint.volume`) the other ranks' directories are named with `rank_dirs`; their shards are
joined in a scratch directory of links, nothing is copied.

The output is `save_pretrained` of the model's own class (config and tokenizer from the model
directory the run trained), loadable by transformers and vLLM.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlscale.trainer import checkpoint

POLICY_TAG = "policy"
# What of the model directory travels with the weights (the rest is rewritten by save_pretrained).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "generation_config.json")
MARKER = "rlscale_export.json"


class ExportError(RuntimeError):
    """A run or checkpoint that cannot be exported; the message names what to pass."""


@dataclass(frozen=True)
class Exported:
    out: Path | None
    step: int
    zero_stage: int
    dtype: str
    parameters: int
    adapter: Path | None = None  # spec.lora runs: the peft adapter directory written (--adapter)
    lora: bool = False  # a spec.lora checkpoint: `parameters` counts the adapter's


def find_step(run: Path, step: int | None = None) -> Path:
    """The checkpoint step directory of `run`: a run directory (holding checkpoints/), a checkpoint
    directory (holding step-*), or a step directory itself; the newest complete unless `step`."""
    run = Path(run)
    if (run / checkpoint.STATE_FILE).is_file():
        return run
    base = run / "checkpoints" if (run / "checkpoints").is_dir() else run
    if step is not None:
        path = base / checkpoint.step_name(step)
        if not (path / checkpoint.STATE_FILE).is_file():
            have = [checkpoint.step_of(p) for p in checkpoint.complete_steps(base)]
            raise ExportError(f"--step {step}: {base} holds no complete checkpoint of that step (complete: {have})")
        return path
    found = checkpoint.latest_checkpoint(base)
    if found is None:
        raise ExportError(f"{run}: no complete checkpoint here or under checkpoints/ (a step-* directory with its "
                          f"{checkpoint.STATE_FILE}); pass the run directory of `rlscale run` or checkpoint.path")
    return found


def run_model_dir(run: Path) -> tuple[str | None, str | None]:
    """The model directory and dtype the run trained with, from the run config `rlscale run` wrote."""
    for where in (Path(run), Path(run).parent, Path(run).parent.parent):
        cfg = where / "run.json"
        if cfg.is_file():
            d = json.loads(cfg.read_text())
            dtype = (d.get("spec") or {}).get("model", {}).get("dtype")
            return d.get("model_dir"), dtype
    return None, None


def _shard_dir(step_dir: Path, rank_dirs: list[Path], scratch: Path) -> Path:
    """A directory whose POLICY_TAG folder holds every rank's files of this step (links)."""
    if not rank_dirs:
        return step_dir
    tag = scratch / POLICY_TAG
    tag.mkdir(parents=True)
    for d in [step_dir, *(Path(r) / step_dir.name if (Path(r) / step_dir.name).is_dir() else Path(r)
                          for r in rank_dirs)]:
        src = d / POLICY_TAG
        if not src.is_dir():
            raise ExportError(f"--rank-dir: {d} has no {POLICY_TAG}/ of {step_dir.name}; name each rank's "
                              "checkpoint directory (or its step directory)")
        for f in src.iterdir():
            if not (tag / f.name).exists():
                (tag / f.name).symlink_to(f.resolve())
    return scratch


def zero_stage_of(tag_dir: Path) -> int:
    """0 when no ZeRO optimizer partitions exist, else the stage the model states record."""
    if not any(tag_dir.glob("*optim_states.pt")):
        return 0
    import torch

    states = sorted(tag_dir.glob("*model_states.pt"))
    sd = torch.load(states[0], map_location="cpu", weights_only=False)
    stage = (sd.get("ds_config") or {}).get("zero_optimization", {}).get("stage")
    return int(stage) if stage is not None else (3 if "zero_pp_rank" in states[0].name else 1)


def consolidated_state_dict(ckpt: Path) -> tuple[dict, int]:
    """name -> tensor of the policy, and the ZeRO stage it was saved at."""
    import torch

    tag_dir = ckpt / POLICY_TAG
    if not tag_dir.is_dir():
        raise ExportError(f"{ckpt}: no {POLICY_TAG}/ DeepSpeed state (was it written by rlscale?)")
    stage = zero_stage_of(tag_dir)
    if stage == 0:
        sd = torch.load(tag_dir / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)["module"]
        return dict(sd), 0
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    try:
        return dict(get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag=POLICY_TAG)), stage
    except (FileNotFoundError, ValueError) as exc:
        raise ExportError(f"{ckpt}: the ZeRO-{stage} partitions are incomplete ({exc}); with one checkpoint volume "
                          "per rank, pass every other rank's directory with --rank-dir") from exc


def export_hf(run: Path, out: Path | None, *, model_dir: str | Path | None = None,
              rank_dirs: list[Path] | None = None, step: int | None = None, dtype: str | None = None,
              adapter: Path | None = None) -> Exported:
    """Write the Hugging Face directory `out` from the run's newest (or `step`) complete checkpoint; for a
    spec.lora run, the base with the adapter merged, and with `adapter` also peft's adapter directory."""
    if out is None and adapter is None:
        raise ExportError("export: give --hf OUT, --adapter OUT (a spec.lora run), or both")
    step_dir = find_step(run, step)
    saved_model, saved_dtype = run_model_dir(run)
    model_dir = Path(model_dir or saved_model or "")
    if not str(model_dir) or not (model_dir / "config.json").is_file():
        raise ExportError(f"--model: {model_dir or 'not given'} is not a model directory with a config.json; pass "
                          "the directory the run trained (its run.json names it for `rlscale run`)")
    dtype = dtype or saved_dtype or "float32"
    for flag, where in (("--hf", out), ("--adapter", adapter)):
        if where is not None and Path(where).exists() and any(Path(where).iterdir()) \
                and not (Path(where) / MARKER).is_file():
            raise ExportError(f"{flag}: {where} exists and is not an earlier export; give an empty or new directory")
    from rlscale.trainer.lora.export import lora_state

    lora = lora_state(step_dir)
    if adapter is not None and lora is None:
        raise ExportError(f"--adapter: {step_dir} is a full-model checkpoint (the run had no spec.lora); use --hf")
    with tempfile.TemporaryDirectory(prefix="rlscale-export-") as scratch:
        sd, stage = consolidated_state_dict(_shard_dir(step_dir, list(rank_dirs or []), Path(scratch)))
    if lora is not None:
        return _export_lora(sd, lora, stage, step_dir, model_dir, dtype, out, adapter)
    out = Path(out)
    done = Exported(out, checkpoint.step_of(step_dir), stage, dtype, sum(v.numel() for v in sd.values()))
    with atomic_dir(out) as tmp:
        save_hf(sd, model_dir, tmp, dtype, source=str(step_dir))
        write_marker(tmp, {"checkpoint": str(step_dir), "step": done.step, "zeroStage": stage, "dtype": dtype,
                           "parameters": done.parameters})
    return done


def _export_lora(sd: dict, lora: dict, stage: int, step_dir: Path, model_dir: Path, dtype: str, out: Path | None,
                 adapter: Path | None) -> Exported:
    """A spec.lora checkpoint: the merged model to `out`, peft's adapter directory to `adapter`."""
    from rlscale.trainer.lora.export import AdapterMismatch, peft_model_from, save_adapter
    from rlscale.trainer.lora.policy import merged_items

    try:
        model = peft_model_from(sd, lora, model_dir, dtype, str(step_dir))
    except AdapterMismatch as exc:
        raise ExportError(str(exc)) from exc
    trained = sum(v.numel() for v in sd.values())
    about = {"checkpoint": str(step_dir), "step": checkpoint.step_of(step_dir), "zeroStage": stage, "dtype": dtype,
             "adapterParameters": trained}
    if out is not None:
        with atomic_dir(out) as tmp:
            save_hf(merged_items(model), model_dir, tmp, dtype, source=str(step_dir))
            write_marker(tmp, {**about, "merged": True})
    if adapter is not None:
        with atomic_dir(adapter) as tmp:
            save_adapter(model, model_dir, tmp, _TOKENIZER_FILES)
            write_marker(tmp, {**about, "adapter": True})
    return Exported(Path(out) if out is not None else None, about["step"], stage, dtype, trained,
                    Path(adapter) if adapter is not None else None, lora=True)


def write_marker(out: Path, about: dict) -> None:
    """What an export directory was written from (MARKER): how a later export knows it may replace it."""
    (Path(out) / MARKER).write_text(json.dumps(about, indent=1) + "\n")


@contextmanager
def atomic_dir(out: str | Path) -> Iterator[Path]:
    """A new directory beside `out` to write the export into. When the block completes it takes `out`'s
    place (an earlier directory there moves aside, then is deleted); when it raises it is deleted and `out`
    stays as it was. So `out` is never a half-written directory, also after a crash: what a crashed
    writer left beside it (`.NAME.tmp-*`, `.NAME.old-*`) is deleted by the next export."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in [*out.parent.glob(f".{out.name}.tmp-*"), *out.parent.glob(f".{out.name}.old-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the model from other users of the volume
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out.exists() or out.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / out.name)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save_hf(state_dict: Mapping[str, Any] | Iterable[tuple[str, Any]], model_dir: str | Path, out: str | Path,
            dtype: str, source: str = "") -> Path:
    """Write the weights (a mapping or (name, tensor) pairs, under the names the learner's module gives
    its parameters) as a Hugging Face model directory: the model class of `model_dir`'s config,
    save_pretrained, and its tokenizer files. Pairs are consumed one at a time into the model (the
    learner's iter_weights streams them), so the whole model is held once, in `dtype`; the model is
    built before the first pair is asked for."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir, out = Path(model_dir), Path(out)
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    pairs = state_dict.items() if isinstance(state_dict, Mapping) else state_dict
    _load_weights(model, pairs, f"{source or 'the weights'}: do not match {model_dir}'s model")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in _TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, out / name)
    return out


def _load_weights(model: Any, pairs: Iterable[tuple[str, Any]], mismatch: str) -> None:
    """Copy each (name, tensor) into the model's parameter (or buffer) of that name, cast to its dtype;
    every parameter must be given (a tied one once, under either name)."""
    import torch

    targets = model.state_dict(keep_vars=True)
    given: set[int] = set()
    unexpected: list[str] = []
    with torch.no_grad():
        for name, tensor in pairs:
            target = targets.get(name)
            if target is None:
                unexpected.append(name)
                continue
            if tuple(target.shape) != tuple(tensor.shape):
                raise ExportError(f"{mismatch} ({name}: {tuple(tensor.shape)}, the model's {tuple(target.shape)}); "
                                  "pass the model directory this run trained with --model")
            target.copy_(tensor)
            given.add(id(target))
    missing = [n for n, p in model.named_parameters() if id(p) not in given]
    if missing or unexpected:
        raise ExportError(f"{mismatch} (missing {missing[:5]}, unexpected {unexpected[:5]}); pass the model "
                          "directory this run trained with --model")
