"""Per-turn credit in a real run, in one process: for each spec in args["runs"] (spec.task.turnCredit rewardToGo
with the environment below), the driver's own step (rlscale.trainer.driver.Driver.step) with a real DeepSpeed
learner on builtin:tiny-arith, the multi-turn loop built from the spec (rlscale.trainer.tools.setup.multi_turn)
around HF generate on the learner's weights. Prints one line per run: RESULT {json} with the step records, the
turns and step rewards of the batches the learner trained on, and how far the policy's parameters moved.

Usage: python turn_credit_worker.py ARGS_JSON, with RANK/WORLD_SIZE in the env.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import algorithm_worker  # noqa: E402 - beside this script
from algorithm_worker import HFRollout, movement, snapshot  # noqa: E402


class RetryEnv:
    """A sum to answer in two tries: the right answer earns 0.5 and ends; a wrong one costs 0.25 and is
    answered with "=" (try again). task.reward (exact-match) scores the last try on top."""

    def reset(self, row):
        self.answer = str(row["answer"])
        return ""

    def step(self, action):
        if action.strip() == self.answer:
            return "", 0.5, True
        return "=", -0.25, False


def run_one(run: dict, model: Path, tok, workdir: Path) -> dict:
    from rlscale.plan import make_plan
    from rlscale.spec import parse_spec
    from rlscale.trainer.data import build_task
    from rlscale.trainer.driver import Driver, Task, prompt_tokens
    from rlscale.trainer.learner import Learner, LearnerConfig
    from rlscale.trainer.plan_source import FixedPlan
    from rlscale.trainer.rewards import resolve_reward
    from rlscale.trainer.sinks import RunLog
    from rlscale.trainer.tools.setup import multi_turn

    started = time.perf_counter()
    spec = parse_spec(run["spec"])
    learner = Learner(LearnerConfig.from_spec(spec, str(model), seed=0))
    before = snapshot(learner.engine.module)
    built = build_task(spec, tok, model=spec.model.path)
    rollout = multi_turn(spec, HFRollout(learner, tok), tok, [*built.train, *built.eval], prompt_tokens)
    trained, step = [], learner.step

    def recording_step(batch, lr=None):
        trained.append({"turn_starts": batch.turn_starts, "turn_rewards": batch.turn_rewards,
                        "rewards": batch.rewards})
        return step(batch, lr)

    learner.step = recording_step
    run_log = RunLog(workdir / run["name"], spec.target.value, spec.target.metric, run["name"], report=False)
    d = Driver(spec=spec, plan=replace(make_plan(spec), prompts=spec.batch.prompts),
               task=Task(built.train, built.eval[:8], resolve_reward(spec.task.reward), spec.task.max_new_tokens),
               tokenizer=tok, learner=learner, rollout=rollout, run_log=run_log, sinks=[run_log],
               plan_source=FixedPlan(), ckpt_dir=workdir / run["name"] / "ckpt", run_id=run["name"])
    records = [d.step() for _ in range(run["steps"])]
    moved = movement(learner.engine.module, before)
    learner.shutdown()
    return {"name": run["name"], "trained": trained, "moved": moved,
            "records": [{"loss": r.loss, "skipped": r.skipped, "turns": (r.tools or {}).get("turns")}
                        for r in records],
            "seconds": time.perf_counter() - started}


if __name__ == "__main__":
    algorithm_worker.main(json.loads(Path(sys.argv[1]).read_text()), run_one)
