"""A learner rank for the tests, run as its own process (DeepSpeed owns the process group).

Usage: python learner_worker.py MODE ARGS_JSON, with RANK/WORLD_SIZE/MASTER_* in the env.
Modes: `fixed` (steps on given batches, then every rank dumps its parameters),
`loop` (a driver-like loop with sampling and checkpoints; may kill itself mid-run),
`grpo` (GRPO on the builtin task, printing held-out accuracy before and after),
`gang` (one rank SIGKILLs itself once every rank is up; the survivor must notice).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch

from rlscale.trainer.batching import RolloutBatch
from rlscale.trainer.generation import accuracy, generate
from rlscale.trainer.learner import Learner, LearnerConfig
from rlscale.trainer.rewards import exact_match, score
from rlscale.trainer.tasks import ArithmeticTask, PromptIterator


def dump_params(learner: Learner, path: Path) -> None:
    torch.save({n: p.detach().clone() for n, p in learner.engine.module.named_parameters()}, path)


def fixed(args: dict) -> None:
    """Steps on given batches; args["runs"] (a list of such args) builds one learner after another
    in this process, each with its own config, batches, lrs and out, saving a start per learner."""
    for run in args.get("runs", [args]):
        learner = Learner(LearnerConfig(**run["config"]))
        out = Path(run["out"])
        out.mkdir(parents=True, exist_ok=True)
        if learner.rank == 0:
            from deepspeed.comm import comm

            print("COMM", json.dumps({"shm_comm_op": comm.cdb.shm_comm_op is not None}), flush=True)
            for batch, lr in zip(run["batches"], run["lrs"], strict=True):
                stats = learner.step(batch, lr=lr)
                print("STATS", json.dumps(stats), flush=True)
            torch.save(learner.export_weights(), out / "exported.pt")
            learner.shutdown(failed=bool(run.get("fail")))  # "fail": as rank 0 does when it stops on an error
        else:
            print("FOLLOWED", learner.follow(), flush=True)
        if learner.config.zero_stage < 3:  # under ZeRO-3 a rank holds only a shard
            dump_params(learner, out / f"rank{learner.rank}.pt")
        del learner


def rollout_batch(learner, tokenizer, problems, n, step, reward_fn=exact_match, max_new_tokens=4, seed=0):
    """Sample with the learner's own weights, seeded by step (and run seed), as the driver's rollout would."""
    outs = generate(learner.engine.module, tokenizer, [p.prompt for p in problems], samples_per_prompt=n,
                    max_new_tokens=max_new_tokens, temperature=1.0, seed=step * 7919 + 17 + seed * 104729)
    rewards = score(reward_fn, [p.prompt for p in problems for _ in range(n)], [o.text for o in outs],
                    [p.answer for p in problems for _ in range(n)], [o.finished for o in outs])
    return RolloutBatch([o.prompt_ids for o in outs], [o.response_ids for o in outs], rewards, n)


def loop(args: dict) -> None:
    """Steps until args['steps'], checkpointing every args['every']; records each step's batch."""
    from transformers import AutoTokenizer

    learner = Learner(LearnerConfig(**args["config"]))
    tok = AutoTokenizer.from_pretrained(args["config"]["model_path"])
    task = ArithmeticTask(difficulty=1, seed=0)
    data = PromptIterator(task.train, seed=1)
    step = 0
    state = learner.load_checkpoint(args["ckpt"])
    if state is not None:
        step = state["step"]
        data.load_state_dict(state["data"])
    record = Path(args["out"]) / f"run-{args['tag']}.jsonl"
    while step < args["steps"]:
        problems = data.next_batch(args["prompts"])
        # "signal": a reward that tells samples apart (the parity of the response's length), so steps train.
        reward_fn = (lambda p, c, a, e=None, finished=True: float(len(c) % 2)) if args.get("signal") else exact_match
        batch = rollout_batch(learner, tok, problems, args["samples_per_prompt"], step, reward_fn=reward_fn)
        trained_before = learner.steps
        stats = learner.step(batch)
        step += 1
        digest = sum(p.double().sum().item() for p in learner.engine.module.parameters())
        with open(record, "a") as f:
            f.write(json.dumps({"step": step, "prompts": [p.prompt for p in problems],
                                "responses": batch.response_ids, "param_sum": digest, "lr": stats["lr"],
                                "trained_before": trained_before, "skipped": stats.get("skipped", 0.0)}) + "\n")
        if step % args["every"] == 0:
            learner.save_checkpoint(args["ckpt"], {"step": step, "data": data.state_dict()}, keep=2)
        if step == args.get("crash_after"):
            # Die mid-checkpoint: a half-written directory must never be mistaken for a good one.
            partial = Path(args["ckpt"]) / f".tmp-step-{step + 1:08d}"
            partial.mkdir(parents=True, exist_ok=True)
            (partial / "half-written").write_text("x")
            os.kill(os.getpid(), signal.SIGKILL)
    learner.shutdown()


def break_advantages(how: str) -> None:
    """A deliberately broken learner for the test of the learning test: the learner reads
    `algorithms.grpo_advantages` at call time, so patching the module breaks every step."""
    from rlscale.trainer import algorithms

    real = algorithms.grpo_advantages
    if how == "zero":
        algorithms.grpo_advantages = lambda rewards, *a, **kw: torch.zeros_like(real(rewards, *a, **kw))
    elif how == "flip":
        algorithms.grpo_advantages = lambda rewards, *a, **kw: -real(rewards, *a, **kw)
    else:
        raise ValueError(f"learner_worker: unknown breakage {how!r}")


def grpo(args: dict) -> None:
    """GRPO from the builtin warm-started model; prints accuracy before and after as JSON.

    args: steps, prompts, samples_per_prompt, seed (prompt order and sampling), eval_every
    (held-out accuracy every so many steps, into "curve"), broken ("zero"/"flip" advantages).
    """
    from transformers import AutoTokenizer

    if args.get("broken"):
        break_advantages(args["broken"])
    seed = args.get("seed", 0)
    learner = Learner(LearnerConfig(**args["config"]))
    tok = AutoTokenizer.from_pretrained(args["config"]["model_path"])
    torch.manual_seed(seed)
    task = ArithmeticTask(difficulty=1, seed=0)
    data = PromptIterator(task.train, seed=seed)
    before = accuracy(learner.engine.module, tok, task.eval, max_new_tokens=4)
    rewards, noise, curve = [], [], {}
    for step in range(args["steps"]):
        batch = rollout_batch(learner, tok, data.next_batch(args["prompts"]), args["samples_per_prompt"], step,
                              seed=seed)
        stats = learner.step(batch)
        rewards.append(sum(batch.rewards) / len(batch))
        noise.append(stats["noise_scale"])
        if args.get("eval_every") and (step + 1) % args["eval_every"] == 0 and step + 1 < args["steps"]:
            curve[step + 1] = accuracy(learner.engine.module, tok, task.eval, max_new_tokens=4)
            print("CURVE", step + 1, curve[step + 1], flush=True)
    after = accuracy(learner.engine.module, tok, task.eval, max_new_tokens=4)
    print("RESULT", json.dumps({"before": before, "after": after, "rewards": rewards, "noise_scale": noise,
                                "curve": curve}), flush=True)
    learner.shutdown()



def gang(args: dict) -> None:
    """Rank args["dies"] kills itself once the gang is up; the other waits outside any collective
    (as rank 0 does while replicas generate), so only the gang watch can notice. (Inside a gloo
    collective the survivor fails at once anyway; NCCL's would wait out its timeout.)"""
    import time

    learner = Learner(LearnerConfig(**args["config"]))
    print(f"GANG-UP {time.time():.3f}", flush=True)
    if learner.rank == args["dies"]:
        time.sleep(2)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(args["wait"])
    print("GANG-SURVIVED", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("WORKER_THREADS", "1")))
    mode, args_json = sys.argv[1], sys.argv[2]
    {"fixed": fixed, "loop": loop, "grpo": grpo, "gang": gang}[mode](json.loads(Path(args_json).read_text()))
