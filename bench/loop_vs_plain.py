"""The whole training loop: `rlscale run` (vLLM behind Ray Serve, the DeepSpeed learner, weight
publishing) against a plain single-process GRPO loop (HF generate, the same reward and loss,
AdamW) on the same model, task and batch, in one run of this script; and rlscale's own parts
(engine, reward, learner, weight update) called one after the other in this process, which is
the most the loop could reach with no overhead at all (the ceiling).

Order: plain loop, then the rlscale run, then the plain loop again, so a machine that slows
down during the run slows both sides; the parts last. rlscale's rate is read from its own step
records: the median step (`step_seconds`) and the wall clock between the first measured step and
the last (record times, with nothing else running: no evals, no checkpoints). Prints the ratios
and a per-phase profile of all three.

    .venv/bin/python bench/loop_vs_plain.py                      # the quickstart at its planned batch
    .venv/bin/python bench/loop_vs_plain.py --prompts 16 --steps 40
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from rlscale.roles import RunEnd

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "rlscale" / "torch_extensions"))
WARMUP = 3


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", type=Path, default=ROOT / "examples" / "quickstart.yaml")
    p.add_argument("--prompts", type=int, default=None, help="prompts per step (default: the planner's choice)")
    p.add_argument("--steps", type=int, default=30, help="measured steps per side, after 3 warm-up steps")
    p.add_argument("--json", type=Path, help="also write the results here")
    return p.parse_args(argv)


def planned(spec_path: Path) -> dict:
    from rlscale.plan import make_plan
    from rlscale.spec import load_rlrun

    return make_plan(load_rlrun(spec_path).spec).to_dict()


class PlainGRPO:
    """GRPO in one process: HF generate, the spec's reward, one AdamW step per batch (as TRL does)."""

    def __init__(self, spec, lr: float, seed: int = 0):
        import torch
        from learner_throughput import PlainLoop

        from rlscale.trainer.builtin import resolve_model_path
        from rlscale.trainer.data import load_task
        from rlscale.trainer.modeling import build_tokenizer
        from rlscale.trainer.rewards import resolve_reward
        from rlscale.trainer.tasks import PromptIterator

        torch.manual_seed(seed)
        path = resolve_model_path(spec.model.path)
        self.loop = PlainLoop(str(path), getattr(torch, spec.model.dtype), spec.batch.micro_batch, torch.device("cpu"))
        for group in self.loop.opt.param_groups:
            group["lr"] = lr
        self.tok = build_tokenizer()
        self.reward = resolve_reward(spec.task.reward, format_pattern=spec.task.format_pattern)
        self.data = PromptIterator(load_task(spec.task.name, spec.task.difficulty, spec.task.seed).train, seed=seed)
        self.spec = spec

    def step(self, prompts: int) -> dict:
        from rlscale.trainer.generation import generate
        from rlscale.trainer.rewards import score

        n = self.spec.batch.samples_per_prompt
        t0 = time.perf_counter()
        problems = self.data.next_batch(prompts)
        outs = generate(self.loop.model, self.tok, [p.prompt for p in problems], samples_per_prompt=n,
                        max_new_tokens=self.spec.task.max_new_tokens, temperature=self.spec.rollout.temperature)
        t1 = time.perf_counter()
        rewards = score(self.reward, [p.prompt for p in problems for _ in range(n)], [o.text for o in outs],
                        [p.answer for p in problems for _ in range(n)], [o.finished for o in outs])
        t2 = time.perf_counter()
        self.loop.step({"prompt_ids": [o.prompt_ids for o in outs], "response_ids": [o.response_ids for o in outs],
                        "rewards": rewards, "samples_per_prompt": n})
        t3 = time.perf_counter()
        return {"samples": len(outs), "step_seconds": t3 - t0,
                "phases": {"generate": t1 - t0, "reward": t2 - t1, "train": t3 - t2}}


class PartsInOneProcess:
    """rlscale's own parts with nothing between them: the vLLM engine in this process (the threads
    a local run gives its replica), the spec's reward, the DeepSpeed learner, and the in-place
    weight update after each step. No Ray, no Serve, no second process: the loop's ceiling."""

    def __init__(self, spec, lr: float, seed: int = 0):
        import torch
        from transformers import AutoTokenizer

        from rlscale.rollout.engine import EngineConfig, RolloutEngine
        from rlscale.trainer.builtin import resolve_model_path
        from rlscale.trainer.data import load_task
        from rlscale.trainer.learner import Learner, LearnerConfig
        from rlscale.trainer.rewards import resolve_reward
        from rlscale.trainer.tasks import PromptIterator

        path = str(resolve_model_path(spec.model.path))
        threads = torch.get_num_threads()
        self.engine = RolloutEngine(EngineConfig(model=path, dtype=spec.model.dtype,
                                                 max_model_len=spec.model.max_length, seed=seed, cpu_threads=threads))
        torch.set_num_threads(threads)  # the engine set its own; the learner gets the same
        # vLLM's worker has set up a one-rank process group; DeepSpeed joins it and reads LOCAL_RANK.
        os.environ.setdefault("LOCAL_RANK", "0")
        self.learner = Learner(LearnerConfig.from_spec(spec, path, learning_rate=lr, seed=seed))
        self.tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.reward = resolve_reward(spec.task.reward, format_pattern=spec.task.format_pattern)
        self.data = PromptIterator(load_task(spec.task.name, spec.task.difficulty, spec.task.seed).train, seed=seed)
        self.spec, self.version = spec, 0

    def step(self, prompts: int) -> dict:
        from rlscale.trainer.batching import RolloutBatch
        from rlscale.trainer.driver import prompt_tokens, rollout_logprobs
        from rlscale.trainer.rewards import score

        spec, n = self.spec, self.spec.batch.samples_per_prompt
        t0 = time.perf_counter()
        problems = self.data.next_batch(prompts)
        prompt_ids = [prompt_tokens(self.tok, p) for p in problems]
        groups = self.engine.generate(prompt_ids, n, temperature=spec.rollout.temperature, top_p=spec.rollout.top_p,
                                      max_new_tokens=spec.task.max_new_tokens, seed=self.version * 7919 + 17)
        t1 = time.perf_counter()
        samples = [s for g in groups for s in g]
        texts = self.tok.batch_decode([s.token_ids for s in samples], skip_special_tokens=True)
        rewards = score(self.reward, [p.prompt for p in problems for _ in range(n)], texts,
                        [p.answer for p in problems for _ in range(n)], [s.finish_reason == "stop" for s in samples])
        t2 = time.perf_counter()
        self.learner.step(RolloutBatch(prompt_ids=[ids for ids in prompt_ids for _ in range(n)],
                                       response_ids=[s.token_ids for s in samples], rewards=rewards,
                                       samples_per_prompt=n, rollout_logprobs=rollout_logprobs(samples)),
                          lr=self.learner.config.lr)
        t3 = time.perf_counter()
        self.version += 1
        self.engine.load_weights(self.learner.export_weights(), self.version)
        t4 = time.perf_counter()
        return {"samples": len(samples), "step_seconds": t4 - t0,
                "phases": {"generate": t1 - t0, "reward": t2 - t1, "train": t3 - t2, "sync": t4 - t3}}


def run_rlscale(spec_doc: dict, prompts: int, steps: int, workdir: Path) -> list[dict]:
    """`rlscale run` for WARMUP + steps steps at a fixed batch, no evals or checkpoints in between."""
    doc = json.loads(json.dumps(spec_doc))
    s = doc["spec"]
    s["batch"]["prompts"] = prompts
    s["target"] = {**s["target"], "value": 1.0, "evalEvery": 100_000}
    s["budget"] = {**s["budget"], "maxSteps": WARMUP + steps}
    s["checkpoint"] = {"every": 100_000}
    spec_file = workdir / "bench.yaml"
    spec_file.write_text(yaml.safe_dump(doc))
    cmd = [str(Path(sys.executable).with_name("rlscale")), "run", str(spec_file), "--runs-dir", str(workdir / "runs"),
           "--fresh"]
    print("rlscale:", " ".join(cmd), flush=True)
    code = subprocess.run(cmd, stdout=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "100"}).returncode
    if code not in (RunEnd.TARGET, RunEnd.BUDGET):  # the run ends at its step budget: exit 3
        raise SystemExit(f"rlscale run exited {code}; its logs are in {workdir / 'runs'}")
    (run_dir,) = (workdir / "runs").iterdir()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("step")]


def phase_medians(records: list[dict], keys: tuple[str, ...]) -> dict[str, float]:
    return {k: statistics.median(r["phases"][k] for r in records) for k in keys}


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from rlscale.plan.samples import scaled_lr
    from rlscale.spec import load_rlrun

    spec = load_rlrun(args.spec).spec
    prompts = args.prompts or planned(args.spec)["prompts"]
    n = spec.batch.samples_per_prompt
    # The lr `rlscale run` uses at this batch: the spec's, rescaled by its rule.
    lr = scaled_lr(spec.optimizer.lr, prompts * n, spec.optimizer.reference_batch, spec.optimizer.scaling)
    print(f"{args.spec.name}: {prompts}x{n} = {prompts * n} samples per step, torch threads "
          f"{torch.get_num_threads()}, {os.cpu_count()} CPUs", flush=True)

    plain = PlainGRPO(spec, lr)
    plain_recs: list[dict] = []

    def plain_steps(count: int) -> None:
        for i in range(WARMUP + count):
            rec = plain.step(prompts)
            if i >= WARMUP:
                plain_recs.append(rec)

    plain_steps(args.steps // 2)
    with tempfile.TemporaryDirectory(prefix="rlscale-bench-loop-") as tmp:
        t0 = time.perf_counter()
        recs = run_rlscale(yaml.safe_load(args.spec.read_text()), prompts, args.steps, Path(tmp))
        run_s = time.perf_counter() - t0
    plain_steps(args.steps - args.steps // 2)
    # Last: vLLM and DeepSpeed set threads and environment in this process, after the plain loop is done.
    parts = PartsInOneProcess(spec, lr)
    parts_recs = [parts.step(prompts) for _ in range(WARMUP + args.steps)][WARMUP:]

    measured = [r for r in recs if r["step"] > WARMUP]
    first = next(r for r in recs if r["step"] == WARMUP)
    wall = measured[-1]["time"] - first["time"]
    rl_wall_rate = sum(r["batch_samples"] for r in measured) / wall
    rl_step = statistics.median(r["step_seconds"] for r in measured)
    pl_step = statistics.median(r["step_seconds"] for r in plain_recs)
    samples = prompts * n
    rl_rate, pl_rate = samples / rl_step, samples / pl_step
    rl_ph = phase_medians(measured, ("generate", "reward", "train", "sync"))
    over = [r["overhead_seconds"] for r in measured if r.get("overhead_seconds") is not None]
    engine = [r["engine_generate_seconds"] for r in measured if r.get("engine_generate_seconds") is not None]
    compute = [r["train_compute_seconds"] for r in measured if r.get("train_compute_seconds") is not None]
    pl_ph = phase_medians(plain_recs, ("generate", "reward", "train"))
    pa_step = statistics.median(r["step_seconds"] for r in parts_recs)
    pa_ph = phase_medians(parts_recs, ("generate", "reward", "train", "sync"))
    pa_rate = samples / pa_step

    print(f"\nplain loop (HF generate, one process): {pl_rate:6.0f} samples/s   median step {pl_step * 1e3:6.0f} ms")
    print(f"rlscale run (vLLM, Ray Serve, DeepSpeed): {rl_rate:6.0f} samples/s   median step {rl_step * 1e3:6.0f} ms"
          f"   wall clock {rl_wall_rate:.0f} samples/s over {len(measured)} steps ({run_s:.0f} s with start-up)")
    print(f"rlscale's parts in one process (no Ray): {pa_rate:6.0f} samples/s   median step {pa_step * 1e3:6.0f} ms")
    print(f"ratio rlscale / plain: {rl_rate / pl_rate:.2f}x per step, {rl_wall_rate / pl_rate:.2f}x by the wall clock")
    print(f"ceiling (the parts in one process / plain): {pa_rate / pl_rate:.2f}x; rlscale reaches "
          f"{rl_rate / pa_rate:.0%} of it")
    print("\nmedian seconds per step   generate  reward   train    sync   (engine / learner compute / loop overhead)")
    print(f"  plain loop              {pl_ph['generate']:8.3f} {pl_ph['reward']:7.3f} {pl_ph['train']:7.3f}")
    print(f"  rlscale                 {rl_ph['generate']:8.3f} {rl_ph['reward']:7.3f} {rl_ph['train']:7.3f} "
          f"{rl_ph['sync']:7.3f}   ({statistics.median(engine) if engine else float('nan'):.3f} / "
          f"{statistics.median(compute) if compute else float('nan'):.3f} / "
          f"{statistics.median(over) if over else float('nan'):.3f})")
    print(f"  parts, one process      {pa_ph['generate']:8.3f} {pa_ph['reward']:7.3f} {pa_ph['train']:7.3f} "
          f"{pa_ph['sync']:7.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "batch": f"{prompts}x{n}", "plain_samples_per_second": pl_rate, "rlscale_samples_per_second": rl_rate,
            "rlscale_wall_samples_per_second": rl_wall_rate, "ratio": rl_rate / pl_rate,
            "parts_samples_per_second": pa_rate, "ceiling": pa_rate / pl_rate,
            "plain_phases": pl_ph, "rlscale_phases": rl_ph, "parts_phases": pa_ph}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
