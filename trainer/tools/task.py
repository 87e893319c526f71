"""builtin:tool-arithmetic and its model builtin:tiny-tools: a task whose answer needs the tool.

Products of a 3-digit and a 2-digit number ("347*58="): the 3.4M-parameter model cannot multiply them, but
it can call the calculator and copy the result. Its warm start (`warm_start`, the recipe TINY_TOOLS) teaches
the call format and the copying on `tool_share` of its demonstrations, chosen at random whatever the
problem, and the decision to call on only `call_prior` of the first response tokens: the model knows how
to use the tool, not when. Greedy, it mostly answers directly and is wrong; sampled, it calls the tool on
some of the trajectories, which then score 1. GRPO has to learn that the call is worth making
(docs/tools.md, examples/tools-quickstart.yaml).

The tokenizer is the character tokenizer of builtin:tiny-arith (the same four special tokens first) with
all printable ASCII, the Hermes tags as one token each, and the calculator call's fixed JSON around the
expression as two tokens: a call is 10 tokens instead of 70, and decodes to the exact Hermes text.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import numpy as np

from rlscale.trainer.tasks import EVAL_SIZE, Problem
from rlscale.trainer.tools.calculator import calculate
from rlscale.trainer.tools.calls import CALL_CLOSE, CALL_OPEN, RESPONSE_CLOSE, RESPONSE_OPEN, observation_text

TASK = "builtin:tool-arithmetic"
MODEL = "builtin:tiny-tools"
CALL_PREFIX = '{"name": "calculator", "arguments": {"expression": "'
CALL_SUFFIX = '"}}'
PIECES = [CALL_OPEN, CALL_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE, CALL_PREFIX, CALL_SUFFIX]
TINY_TOOLS = {
    # A quarter of tiny-arith's width and half its depth (~0.5M parameters): copying the operands into the call
    # and the result into the answer needs two layers, and the sequences are 4x longer than tiny-arith's.
    "shape": {"hidden_size": 128, "num_layers": 2, "num_heads": 2, "head_dim": 64, "intermediate_size": 512},
    "task": TASK,
    "kind": "tools",
    "lr": 2e-3,
    "batch": 64,
    "tool_share": 0.5,  # the share of demonstrations that call the calculator (the format and the copying)
    # The share of calls among the first response tokens the warm start is taught: only some of the tool
    # demonstrations label their <tool_call> token. Greedy, a digit wins; sampled, about 1 in 7 calls.
    "call_prior": 0.15,
    "eval_every": 25,
    "eval_size": 200,
    # With the call forced: the format and the copying are mostly learnt; RL trains the copying further (the
    # call's and the answer's tokens are the model's). A first build reached 0.79-0.86 between steps 650 and
    # 800 and did not settle higher at lr 2e-3 (the log of `ensure_builtin_model('builtin:tiny-tools')`).
    "target_accuracy": 0.8,
    "max_steps": 2000,
    "seed": 0,
    "version": 1,
}


def vocabulary() -> list[str]:
    from rlscale.trainer.modeling import SPECIAL_TOKENS

    return SPECIAL_TOKENS + PIECES + [chr(c) for c in range(32, 127)] + ["\n"]


def build_tokenizer():
    """The tool model's tokenizer (see the module docstring); prepends <bos> like tiny-arith's."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from rlscale.trainer.modeling import BOS, EOS, PAD, UNK

    vocab = {tok: i for i, tok in enumerate(vocabulary())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    pieces = "|".join(re.escape(p) for p in sorted(PIECES, key=len, reverse=True))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(f"{pieces}|[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A $B",
                                                       special_tokens=[(BOS, vocab[BOS])])
    out = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                  unk_token=UNK, padding_side="left", model_max_length=512)
    # The pieces again as added tokens (their ids unchanged): AutoTokenizer, which the driver and vLLM load with,
    # otherwise rebuilds the tokenizer as Qwen2's (the model type's) with its own pre-tokenizer, splitting
    # <tool_call> into 11 characters.
    out.add_tokens([AddedToken(p, special=False, normalized=False) for p in PIECES])
    return out


class ToolArithmeticTask:
    """builtin:tool-arithmetic: every product a*b, a in 100-999 and b in 10-99 (81,000 problems), split by seed."""

    name = TASK

    def __init__(self, seed: int = 0, eval_size: int = EVAL_SIZE):
        problems = [Problem(f"{a}*{b}=", str(a * b)) for a in range(100, 1000) for b in range(10, 100)]
        order = np.random.default_rng(seed).permutation(len(problems))
        self.seed = seed
        self.eval = [problems[i] for i in order[:eval_size]]
        self.train = [problems[i] for i in order[eval_size:]]


def call_text(problem: Problem) -> str:
    return CALL_OPEN + CALL_PREFIX + problem.prompt.rstrip("=") + CALL_SUFFIX + CALL_CLOSE


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


def warm_start(out_dir: Path, recipe: dict, progress: bool = True) -> dict:
    """Supervised warm start until the forced-call accuracy reaches the target (see the module docstring)."""
    import torch
    from transformers import Qwen2ForCausalLM

    from rlscale.trainer.builtin import _progress
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
    with _progress(progress) as report:
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
