"""Measure the GRPO learning test's spread: one learner run per seed, printed as JSON lines.

Usage (from the repo root):
  ATEN_CPU_CAPABILITY=default .venv/bin/python tests/trainer/measure_grpo.py --seeds 0 1 [--broken zero]
Each line: seed, kernel, before/after held-out accuracy, the accuracy curve and the
training reward per step. test_grpo_learns.py's thresholds cite the runs of this script.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from conftest import _run_ranks  # noqa: E402
from test_grpo_learns import PROMPTS, SAMPLES, grpo_config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--broken", choices=["zero", "flip"], default=None)
    a = ap.parse_args()
    from rlscale.trainer.builtin import ensure_builtin_model

    model = ensure_builtin_model("builtin:tiny-arith", progress=False)
    for seed in a.seeds:
        with tempfile.TemporaryDirectory() as tmp:
            args = {"config": grpo_config(model), "steps": a.steps, "prompts": PROMPTS, "samples_per_prompt": SAMPLES,
                    "seed": seed, "eval_every": a.eval_every, "broken": a.broken}
            results = _run_ranks("grpo", args, Path(tmp), timeout=3600)
        line = next(x for x in results[0].stdout.splitlines() if x.startswith("RESULT "))
        r = json.loads(line.split(" ", 1)[1])
        r.pop("noise_scale", None)
        print(json.dumps({"seed": seed, "kernel": os.environ.get("ATEN_CPU_CAPABILITY", "native"),
                          "broken": a.broken, "steps": a.steps, **r}), flush=True)


if __name__ == "__main__":
    main()
