"""One learner process training on a dataset task, as the driver does it but with HF sampling:
the task read from a JSONL file through build_task, rewards from the spec's reward, PPO or GRPO
steps on a real DeepSpeed engine. Prints one JSON line: rewards seen, weights moved, value loss."""

from __future__ import annotations

import json
import sys

import torch


def main(args: dict) -> None:
    from transformers import AutoTokenizer

    from rlscale.spec import parse_spec
    from rlscale.trainer.batching import RolloutBatch
    from rlscale.trainer.data import build_task, try_reward
    from rlscale.trainer.generation import generate
    from rlscale.trainer.learner import Learner, LearnerConfig
    from rlscale.trainer.rewards import resolve_reward, score
    from rlscale.trainer.tasks import PromptIterator

    torch.set_num_threads(2)
    spec = parse_spec(args["spec"])
    tok = AutoTokenizer.from_pretrained(args["model"])
    task = build_task(spec, tok)
    reward = resolve_reward(spec.task.reward, format_pattern=spec.task.format_pattern)
    try_reward(reward, task.train)
    learner = Learner(LearnerConfig.from_spec(spec, args["model"], seed=0))
    before = {k: v.detach().clone() for k, v in learner.engine.module.state_dict().items()}
    data = PromptIterator(task.train, seed=1)
    n = spec.batch.samples_per_prompt
    seen, stats = [], []
    for step in range(args["steps"]):
        problems = data.next_batch(spec.batch.prompts)
        outs = generate(learner.engine.module, tok, [p.prompt for p in problems], samples_per_prompt=n,
                        max_new_tokens=spec.task.max_new_tokens, temperature=1.0, seed=step)
        rewards = score(reward, [p.prompt for p in problems for _ in range(n)], [o.text for o in outs],
                        [p.answer for p in problems for _ in range(n)], [o.finished for o in outs],
                        [p.extra for p in problems for _ in range(n)])
        seen += rewards
        batch = RolloutBatch([o.prompt_ids for o in outs], [o.response_ids for o in outs], rewards, n)
        stats.append(learner.step(batch))
    after = learner.engine.module.state_dict()
    moved = max((after[k].float() - before[k].float()).abs().max().item() for k in before)
    print("RESULT " + json.dumps({"rewards": seen, "moved": moved, "critic": learner.critic is not None,
                                  "train": len(task.train), "eval": len(task.eval), "stats": stats}), flush=True)
    learner.shutdown()


if __name__ == "__main__":
    main(json.loads(open(sys.argv[1]).read()))
