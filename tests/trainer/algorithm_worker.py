"""The algorithm family on the builtin task, in one process: for each spec in args["runs"], a real
DeepSpeed learner built by LearnerConfig.from_spec takes one step on a fixed batch (its stats are the
loss the test checks by hand), then the driver's own step (rlscale.trainer.driver.Driver.step, so
dynamic sampling included) runs args["steps"] steps of the builtin arithmetic task, with HF generate
on the learner's weights as the sampler. Prints one line per run: RESULT {json}, with how far the run moved the
parameters that train and the frozen ones (spec.lora: the adapter and the base).

Usage: python algorithm_worker.py ARGS_JSON, with RANK/WORLD_SIZE/MASTER_* in the env.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from one_replica import OneReplica  # noqa: E402 - beside this script, which runs as its own process


class HFRollout(OneReplica):
    """The driver's rollout port over the learner's own module (its weights are always the newest)."""

    def __init__(self, learner, tok):
        self.learner, self.tok, self.generated = learner, tok, 0

    @torch.no_grad()
    def generate(self, prompt_ids, n, *, temperature, top_p, max_new_tokens, seed=None, version=0):
        model = self.learner.engine.module
        rows = [list(p) for p in prompt_ids for _ in range(n)]
        width = max(len(r) for r in rows)
        pad, eos = self.tok.pad_token_id, self.tok.eos_token_id
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
        attention = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        if seed is not None:
            torch.manual_seed(seed)
        sampling = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature,
                                                                   "top_k": 0, "top_p": top_p}
        was_training = model.training
        model.eval()
        out = model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=max_new_tokens,
                             eos_token_id=eos, pad_token_id=pad, **sampling)
        model.train(was_training)
        samples = []
        for row in out[:, width:].tolist():
            finished = eos in row
            response = row[: row.index(eos) + 1] if finished else [t for t in row if t != pad]
            samples.append(SimpleNamespace(token_ids=response, logprobs=None,
                                           finish_reason="stop" if finished else "length"))
        self.generated += len(samples)
        return [samples[i * n:(i + 1) * n] for i in range(len(prompt_ids))]


def fixed_batch(tok, spec) -> dict:
    """Three groups of two: rewards [1, 0], [0, 1], [1, 1]; response lengths [2, 3], [1, 4], [2, 2];
    the 4-token response (task.maxNewTokens) is the truncated one."""
    prompt = tok("12+34=").input_ids
    digit = tok("5").input_ids[-1]
    lengths = [2, 3, 1, 4, 2, 2]
    return {"prompt_ids": [prompt] * 6, "response_ids": [[digit] * n for n in lengths],
            "rewards": [1.0, 0.0, 0.0, 1.0, 1.0, 1.0], "samples_per_prompt": 2,
            "truncated": [n >= spec.task.max_new_tokens for n in lengths]}


def snapshot(module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def movement(module, before: dict[str, torch.Tensor]) -> dict:
    """How far the run moved the parameters that train and the frozen ones (largest absolute change of each),
    and how many of each there are: with spec.lora the first are the adapter (and a critic's value head), the
    second the base."""
    out = {"trained": 0.0, "frozen": 0.0, "trained_params": 0, "frozen_params": 0}
    for n, p in module.named_parameters():
        kind = "trained" if p.requires_grad else "frozen"
        out[kind] = max(out[kind], float((p.detach() - before[n]).abs().max()))
        out[kind + "_params"] += p.numel()
    return out


def run_one(run: dict, model: Path, tok, workdir: Path) -> dict:
    from rlscale.plan import make_plan
    from rlscale.spec import parse_spec
    from rlscale.trainer.data import build_task
    from rlscale.trainer.driver import Driver, Task
    from rlscale.trainer.learner import Learner, LearnerConfig
    from rlscale.trainer.plan_source import FixedPlan
    from rlscale.trainer.rewards import resolve_reward
    from rlscale.trainer.sinks import RunLog

    started = time.perf_counter()
    spec = parse_spec(run["spec"])
    learner = Learner(LearnerConfig.from_spec(spec, str(model), seed=0))
    modules = {"policy": learner.engine.module, "critic": learner.critic.module if learner.critic else None}
    initial = {k: snapshot(m) for k, m in modules.items() if m is not None}
    fixed = learner.step(fixed_batch(tok, spec))
    built = build_task(spec, tok, model=spec.model.path)
    rollout = HFRollout(learner, tok)
    trained = []
    step = learner.step

    def recording_step(batch, lr=None):
        trained.append({"rewards": batch.rewards, "lengths": [len(r) for r in batch.response_ids],
                        "spp": batch.samples_per_prompt})
        return step(batch, lr)

    learner.step = recording_step
    run_log = RunLog(workdir / run["name"], spec.target.value, spec.target.metric, run["name"])
    d = Driver(spec=spec, plan=replace(make_plan(spec), prompts=spec.batch.prompts),
               task=Task(built.train, built.eval[:8], resolve_reward(spec.task.reward), spec.task.max_new_tokens),
               tokenizer=tok, learner=learner, rollout=rollout, run_log=run_log, sinks=[], plan_source=FixedPlan(),
               ckpt_dir=workdir / run["name"] / "ckpt", run_id=run["name"])
    records = [d.step() for _ in range(run["steps"])]
    moved = {k: movement(modules[k], before) for k, before in initial.items()}
    learner.shutdown()
    return {"name": run["name"], "fixed": fixed, "trained": trained, "generated": rollout.generated, "moved": moved,
            "records": [{"samples": r.samples, "batch_samples": r.batch_samples, "loss": r.loss,
                         "skipped": r.skipped} for r in records],
            "seconds": time.perf_counter() - started}


def main(args: dict, run_one=run_one) -> None:
    """Each of args["runs"] through run_one (this module's, or another worker's beside it) on tiny-arith."""
    from transformers import AutoTokenizer

    from rlscale.trainer.builtin import ensure_builtin_model

    torch.set_num_threads(2)
    model = ensure_builtin_model("builtin:tiny-arith", progress=False)
    tok = AutoTokenizer.from_pretrained(model)
    workdir = Path(args["workdir"])
    for run in args["runs"]:
        print("RESULT " + json.dumps(run_one(run, model, tok, workdir)), flush=True)


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()))
