"""A one-process reference of examples/tools-quickstart.yaml: the same multi-turn loop (MultiTurnRollout, the
sandboxed calculator) over an HF-generate sampler, and GRPO from the learner's own pieces (pack,
response_logprobs, GroupBaseline, aggregate) with plain AdamW, no vLLM, Ray or DeepSpeed. It checks that the
task, the warm start and the loss mask learn, where `rlscale run` cannot be had; prints one JSON line per eval.

    .venv/bin/python bench/tools_reference.py --steps 40 --eval-every 5
    .venv/bin/python bench/tools_reference.py --in-flight 64 [--model DIR]   # many in flight vs one at a time
"""

from __future__ import annotations

import argparse
import json
import time
from types import SimpleNamespace

import torch

from rlscale.trainer.batching import RolloutBatch, pack
from rlscale.trainer.builtin import ensure_builtin_model
from rlscale.trainer.logprobs import response_logprobs
from rlscale.trainer.losses import aggregate
from rlscale.trainer.modeling import load_model
from rlscale.trainer.objectives import GroupBaseline
from rlscale.trainer.rewards import exact_match
from rlscale.trainer.tasks import PromptIterator
from rlscale.trainer.tools.environments import ToolEnvironment
from rlscale.trainer.tools.loop import MultiTurnRollout, response_masks, tool_metrics
from rlscale.trainer.tools.sandbox import ToolDef, ToolPool
from rlscale.trainer.tools.task import ToolArithmeticTask


class HFSampler:
    """The rollout port over model.generate: left-padded contexts, the sampled tokens' log-probs."""

    def __init__(self, model, tok):
        self.model, self.tok = model, tok

    @torch.no_grad()
    def generate(self, prompt_ids, n, *, temperature, top_p, max_new_tokens, seed=None, version=0):
        pad = self.tok.pad_token_id
        width = max(len(p) for p in prompt_ids)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompt_ids])
        greedy = temperature == 0.0
        out = self.model.generate(input_ids=ids, attention_mask=(ids != pad).long(), max_new_tokens=max_new_tokens,
                                  do_sample=not greedy, temperature=None if greedy else temperature, top_k=0,
                                  top_p=1.0, eos_token_id=self.tok.eos_token_id, pad_token_id=pad,
                                  output_scores=True, return_dict_in_generate=True)
        scores = self.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        groups = []
        for row, lp in zip(out.sequences[:, width:].tolist(), scores.tolist(), strict=True):
            eos = self.tok.eos_token_id in row
            k = row.index(self.tok.eos_token_id) + 1 if eos else len(row)
            groups.append([SimpleNamespace(token_ids=row[:k], logprobs=lp[:k], weights_version=version,
                                           finish_reason="stop" if eos else "length")])
        return groups


def evaluate(rollout, tok, problems) -> tuple[float, dict]:
    ids = [tok(p.prompt).input_ids for p in problems]
    trajs = [g[0] for g in rollout.generate(ids, 1, temperature=0.0, top_p=1.0, max_new_tokens=12)]
    right = sum(exact_match(p.prompt, t.text, p.answer) >= 1.0 for p, t in zip(problems, trajs, strict=True))
    return right / len(problems), tool_metrics(trajs)


def in_flight(rollout, tok, problems) -> dict:
    """Trajectories per second with every trajectory of the batch in each turn's generate call, and with one
    trajectory at a time (the same problems, sampled at temperature 1)."""
    ids = [tok(p.prompt).input_ids for p in problems]
    t0 = time.perf_counter()
    batched = [t for g in rollout.generate(ids, 1, temperature=1.0, top_p=1.0, max_new_tokens=12) for t in g]
    t1 = time.perf_counter()
    single = [rollout.generate([i], 1, temperature=1.0, top_p=1.0, max_new_tokens=12)[0][0] for i in ids]
    t2 = time.perf_counter()
    return {"trajectories": len(ids), "in_flight_per_s": round(len(ids) / (t1 - t0), 1),
            "one_at_a_time_per_s": round(len(ids) / (t2 - t1), 1),
            "calls_per_trajectory": [tool_metrics(batched)["calls_per_trajectory"],
                                     tool_metrics(single)["calls_per_trajectory"]]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--in-flight", type=int, default=0, help="measure this many trajectories in flight and exit")
    ap.add_argument("--model", default=None, help="a model directory (`rlscale export`'s) instead of the warm start")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-4)
    a = ap.parse_args()
    torch.manual_seed(0)
    path = a.model or ensure_builtin_model("builtin:tiny-tools", progress=False)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    model = load_model(path)
    pool = ToolPool([ToolDef("calculator", builtin="calculator")], workers=1)
    rollout = MultiTurnRollout(HFSampler(model, tok), tok, max_turns=2, max_tokens=36, max_length=48,
                               tools=ToolEnvironment(pool, tok))
    task = ToolArithmeticTask()
    held = task.eval[:200]
    if a.in_flight:
        model.eval()
        print(json.dumps(in_flight(rollout, tok, task.train[:a.in_flight])), flush=True)
        pool.close()
        return
    data = PromptIterator(task.train, seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.99))
    objective = GroupBaseline("grpo")
    start = time.perf_counter()
    for step in range(a.steps + 1):
        if step % a.eval_every == 0:
            model.eval()
            acc, m = evaluate(rollout, tok, held)
            print(json.dumps({"step": step, "eval_accuracy": acc, "seconds": round(time.perf_counter() - start, 1),
                              "eval_calls_per_trajectory": m["calls_per_trajectory"]}), flush=True)
        if step == a.steps:
            break
        problems = data.next_batch(a.prompts)
        ids = [tok(p.prompt).input_ids for p in problems]
        model.eval()
        trajs = [t for g in rollout.generate(ids, a.samples, temperature=1.0, top_p=1.0, max_new_tokens=12)
                 for t in g]
        rewards = [exact_match(problems[i // a.samples].prompt, t.text, problems[i // a.samples].answer)
                   for i, t in enumerate(trajs)]
        batch = RolloutBatch(prompt_ids=[p for p in ids for _ in range(a.samples)],
                             response_ids=[t.token_ids for t in trajs], rewards=rewards, samples_per_prompt=a.samples,
                             response_mask=response_masks(trajs))
        adv, kept = objective.advantages(batch)
        if not kept:
            continue
        model.train()
        mb = pack(batch, list(range(len(batch))), adv, "cpu")
        logp, _ = response_logprobs(model, mb, chunk=64)
        per_token, _ = objective.policy_loss(logp, logp.detach(), mb.advantages, mb.mask, clip_low=0.2, clip_high=0.2)
        loss = aggregate(per_token, mb.mask, "token-mean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        print(json.dumps({"step": step + 1, "reward": sum(rewards) / len(rewards),
                          **{f"tools/{k}": round(v, 3) for k, v in tool_metrics(trajs).items()}}), flush=True)
    pool.close()


if __name__ == "__main__":
    main()
