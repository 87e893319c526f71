"""The warm start of builtin:tiny-tools (the model of builtin:tool-arithmetic): demonstrations that teach the
call format on every tool row but the decision to call on few (trainer/tools/task.py's recipe)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from rlscale.trainer.tasks import Problem
from rlscale.trainer.tools.calculator import calculate
from rlscale.trainer.tools.calls import CALL_OPEN, observation_text
from rlscale.trainer.tools.task import MODEL, ToolArithmeticTask, build_tokenizer, call_text, vocabulary


def demonstration(tok, problem: Problem, use_tool: bool, decide: bool = True) -> tuple[list[int], list[int]]:
    """(ids, labels) of one warm-start sequence: the model's tokens labelled, the prompt and observation not;
    with `decide` False a tool demonstration leaves its first token (the decision to call) unlabelled."""
    ids = tok(problem.prompt).input_ids
    labels = [-100] * len(ids)
    answer = tok(problem.answer, add_special_tokens=False).input_ids + [tok.eos_token_id]
    if use_tool:
        call = tok(call_text(problem), add_special_tokens=False).input_ids + [tok.eos_token_id]
        obs = tok(observation_text([calculate(problem.prompt.rstrip("="))]), add_special_tokens=False).input_ids
        taught = call if decide else [-100] + call[1:]
        ids, labels = ids + call + obs, labels + taught + [-100] * len(obs)
    return ids + answer, labels + answer


def _batch(tok, problems, rng, share: float, prior: float):
    """A warm-start batch: `share` of the rows call the tool; of those, enough label the call token that calls
    are `prior` of the labelled first response tokens."""
    import torch

    keep = prior * (1 - share) / (share * (1 - prior))
    rows = []
    for p in problems:
        tool = bool(rng.random() < share)
        rows.append(demonstration(tok, p, tool, decide=not tool or bool(rng.random() < keep)))
    width = max(len(r[0]) for r in rows)
    pad = tok.pad_token_id
    ids = torch.tensor([r[0] + [pad] * (width - len(r[0])) for r in rows])
    labels = torch.tensor([r[1] + [-100] * (width - len(r[1])) for r in rows])
    return ids, labels


def forced_accuracy(model, tok, problems: list[Problem]) -> tuple[float, float]:
    """(the share of problems answered right when the first turn is forced to begin with <tool_call>, the share
    whose greedy first turn calls the tool unforced): the format learnt, and how often the model calls."""
    from rlscale.trainer.generation import generate
    from rlscale.trainer.tools.calls import parse_tool_calls

    first = generate(model, tok, [p.prompt + CALL_OPEN for p in problems], max_new_tokens=14, greedy=True)
    contexts = []
    for p, c in zip(problems, first, strict=True):
        calls = parse_tool_calls(CALL_OPEN + c.text, {"calculator": None})
        if len(calls) != 1 or calls[0].error:
            contexts.append(None)
            continue
        try:
            out = calculate(calls[0].arguments.get("expression", ""))
        except ValueError as exc:
            out = f"error: {exc}"
        contexts.append(p.prompt + CALL_OPEN + c.text + tok.eos_token + observation_text([out]))
    live = [i for i, c in enumerate(contexts) if c is not None]
    answers = generate(model, tok, [contexts[i] for i in live], max_new_tokens=8, greedy=True) if live else []
    right = sum(a.text.strip() == problems[i].answer for i, a in zip(live, answers, strict=True))
    unforced = generate(model, tok, [p.prompt for p in problems], max_new_tokens=1, greedy=True)
    calls = sum(tok.convert_ids_to_tokens(u.response_ids[:1]) == [CALL_OPEN] for u in unforced)
    return right / len(problems), calls / len(problems)


def warm_start(out_dir: Path, recipe: dict, progress) -> dict:
    """Supervised warm start until the forced-call accuracy reaches the target (trainer/tools/task.py says what
    it teaches); `progress`: the builder's progress context (rlscale.trainer.builtin), which yields
    report(text, evaluated)."""
    import torch
    from transformers import Qwen2ForCausalLM

    from rlscale.trainer.modeling import qwen2_config, save_model
    from rlscale.trainer.tasks import PromptIterator

    start = time.perf_counter()
    torch.manual_seed(recipe["seed"])
    rng = np.random.default_rng(recipe["seed"])
    tok = build_tokenizer()
    model = Qwen2ForCausalLM(qwen2_config(vocab_size=len(vocabulary()), **recipe["shape"]))
    task = ToolArithmeticTask(seed=recipe["seed"])
    held = task.eval[: recipe["eval_size"]]
    data = PromptIterator(task.train, seed=recipe["seed"])
    opt = torch.optim.AdamW(model.parameters(), lr=recipe["lr"])
    acc, calls, step = 0.0, 0.0, 0
    with progress as report:
        while step < recipe["max_steps"] and acc < recipe["target_accuracy"]:
            model.train()
            ids, labels = _batch(tok, data.next_batch(recipe["batch"]), rng, recipe["tool_share"], recipe["call_prior"])
            loss = model(input_ids=ids, attention_mask=(ids != tok.pad_token_id).long(), labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            evaluated = step % recipe["eval_every"] == 0
            if evaluated:
                acc, calls = forced_accuracy(model, tok, held)
            report(f"warm-starting {MODEL}: step {step}, loss {loss.item():.3f}, accuracy with the call forced "
                   f"{acc:.1%} (stops at {recipe['target_accuracy']:.0%}), greedy calls {calls:.1%}", evaluated)
    if acc < recipe["target_accuracy"]:
        raise RuntimeError(f"warm start of {MODEL} stopped at {step} steps with forced-call accuracy {acc:.2f} < "
                           f"{recipe['target_accuracy']}; raise max_steps in trainer/tools/task.py")
    save_model(model, tok, out_dir)
    return {"steps": step, "forced_call_accuracy": acc, "greedy_call_share": calls,
            "seconds": round(time.perf_counter() - start, 1), "recipe": json.loads(json.dumps(recipe)),
            "built_by_pid": os.getpid()}
