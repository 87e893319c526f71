"""Warm start of builtin:tiny-arith: the recipe against the one before it.

Baseline: the recipe before (version 1): supervised fine-tuning on the 2-digit training split
alone, stopped at 0.4 held-out accuracy. The recipe (trainer/builtin.py TINY_ARITH) mixes
1-digit sums into every batch and stops at 0.6. Both run here one after the other from the
same seed, and each finished model is read the way GRPO meets it: greedy and temperature-1
accuracy on the 500 held-out prompts and the accuracy of each answer digit. With --grpo, a
plain single-process GRPO loop (bench/loop_vs_plain.py's, the quickstart's 32x8 and lr) then
trains each model until the mean of 3 held-out evals, one every 10 steps, reaches 0.8.

    .venv/bin/python bench/warm_start.py                  # both warm starts: 16 min on 2 AVX2 cores
    .venv/bin/python bench/warm_start.py --grpo           # and GRPO from each to 0.8 (much longer)
    .venv/bin/python bench/warm_start.py --only recipe --grpo --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=["recipe", "baseline"], help="run one side only")
    p.add_argument("--samples-per-prompt", type=int, default=4, help="temperature-1 samples per held-out prompt")
    p.add_argument("--grpo", action="store_true", help="then GRPO from each model to --target")
    p.add_argument("--seeds", default="0", help="GRPO seeds, comma-separated")
    p.add_argument("--target", type=float, default=0.8)
    p.add_argument("--max-samples", type=int, default=200_000, help="GRPO gives up after this many samples")
    p.add_argument("--json", type=Path, help="also write the results here")
    return p.parse_args(argv)


def digit_accuracy(model_dir: Path, samples_per_prompt: int) -> dict:
    """Greedy and temperature-1 held-out accuracy, and each side's units- and tens-digit accuracy."""
    from transformers import AutoModelForCausalLM

    from rlscale.trainer.data import load_task
    from rlscale.trainer.generation import generate
    from rlscale.trainer.modeling import build_tokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = build_tokenizer()
    held_out = load_task("builtin:arithmetic").eval
    prompts = [p.prompt for p in held_out]
    result = {}
    for name, kw, k in (("greedy", {"greedy": True}, 1),
                        ("sampled", {"samples_per_prompt": samples_per_prompt, "temperature": 1.0, "seed": 1},
                         samples_per_prompt)):
        outs = generate(model, tok, prompts, max_new_tokens=4, **kw)
        right = units = tens = 0
        for i, out in enumerate(outs):
            answer, text = held_out[i // k].answer, out.text.strip()
            right += text == answer and out.finished
            units += text[-1:] == answer[-1:]
            tens += len(text) >= 2 and text[-2:-1] == answer[-2:-1]
        n = len(outs)
        result[name] = {"accuracy": right / n, "units_digit": units / n, "tens_digit": tens / n}
    return result


def grpo_samples_to_target(model_dir: Path, seed: int, target: float, max_samples: int) -> dict:
    """Plain GRPO at the quickstart's planned batch and lr from model_dir: samples until the mean
    of the last 3 held-out evals (one every 10 steps) reaches target."""
    import math
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from loop_vs_plain import PlainGRPO, planned

    from rlscale.plan.samples import scaled_lr
    from rlscale.spec import load_rlrun
    from rlscale.trainer.data import load_task
    from rlscale.trainer.generation import accuracy
    from rlscale.trainer.rewards import exact_match

    spec_path = Path(__file__).parent.parent / "examples" / "quickstart.yaml"
    spec = load_rlrun(spec_path).spec
    prompts = planned(spec_path)["prompts"]
    opt = spec.optimizer
    lr = scaled_lr(opt.lr, prompts * spec.batch.samples_per_prompt, opt.reference_batch, opt.scaling)
    spec.model.path = str(model_dir)
    loop = PlainGRPO(spec, lr, seed=seed)
    held_out = load_task("builtin:arithmetic").eval
    evals, samples, step = [], 0, 0
    while samples < max_samples:
        samples += loop.step(prompts)["samples"]
        step += 1
        if step % 10 == 0:
            evals.append(accuracy(loop.loop.model, loop.tok, held_out, max_new_tokens=4, reward=exact_match))
            if len(evals) >= 3 and sum(evals[-3:]) / 3 >= target:
                return {"seed": seed, "samples_to_target": samples, "prompts": prompts, "lr": lr}
    return {"seed": seed, "samples_to_target": math.inf, "best": max(evals, default=0.0), "prompts": prompts,
            "lr": lr}


def main(argv=None) -> int:
    args = parse_args(argv)
    from rlscale.trainer.builtin import TINY_ARITH, warm_start

    before = {**{k: v for k, v in TINY_ARITH.items() if k != "mix"}, "target_accuracy": 0.4}
    recipes = {"recipe": dict(TINY_ARITH), "baseline": before}
    if args.only:
        recipes = {args.only: recipes[args.only]}
    results = {}
    for name, recipe in recipes.items():
        out = Path(tempfile.mkdtemp(prefix=f"rlscale-ws-{name}-"))
        info = warm_start(out, recipe, progress=True)
        results[name] = {"steps": info["steps"], "seconds": info["seconds"], "accuracy": info["accuracy"],
                         "mix": recipe.get("mix"), **digit_accuracy(out, args.samples_per_prompt)}
        print(json.dumps({name: results[name]}), flush=True)
        if args.grpo:
            results[name]["grpo"] = []
            for seed in (int(x) for x in args.seeds.split(",")):
                results[name]["grpo"].append(grpo_samples_to_target(out, seed, args.target, args.max_samples))
                print(json.dumps({name: results[name]["grpo"][-1]}), flush=True)

    print(f"\n{'':10} {'steps':>6} {'seconds':>8} {'greedy':>7} {'T=1':>6} {'units':>6} {'tens':>6}  (held-out, "
          "digit accuracy greedy)")
    for name, r in results.items():
        print(f"{name:10} {r['steps']:6d} {r['seconds']:8.1f} {r['greedy']['accuracy']:7.3f} "
              f"{r['sampled']['accuracy']:6.3f} {r['greedy']['units_digit']:6.3f} {r['greedy']['tens_digit']:6.3f}")
    if len(results) == 2:
        ratio = results["baseline"]["seconds"] / results["recipe"]["seconds"]
        print(f"warm start: the recipe (to {results['recipe']['accuracy']:.2f}) ran {ratio:.2f}x as fast as the "
              f"baseline (to {results['baseline']['accuracy']:.2f}, 2-digit data alone)")
    for name, r in results.items():
        if r.get("grpo"):
            got = sorted(g["samples_to_target"] for g in r["grpo"])
            print(f"GRPO from the {name} to {args.target}: median {got[len(got) // 2]:,} samples "
                  f"(seeds: {', '.join(f'{g:,}' for g in got)})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
