"""builtin:smollm2-135m-tools: SmolLM2-135M-Instruct warm-started to call the calculator of builtin:tool-arithmetic
through its own chat template (examples/smollm2-tools.yaml; docs/tools.md, "SmolLM2: its own chat template").

Untouched, the model writes no `<tool_call>` from the run's prompt, so every reward is 0 and GRPO skips every step.
The recipe (SMOLLM2_TOOLS) trains a small LoRA adapter on the attention projections, supervised, on demonstrations
rendered token for token as a run renders a trajectory: the prompt as `rlscale.trainer.data.render` writes it (the
template, the calculator's signature Hermes-style in the system message), the call, the calculator's answer as the
template's `tool` message (`observation_text`), the final answer. The loss is on the model's turns only (each with
its `<|im_end|>`). `call_share` of the demonstrations call the calculator; the rest answer directly, in the same
words as the answer after a call ("The answer is N."), which the model mostly gets wrong on a 4-5 digit product.
So the model learns the call's format and the copying of the result, and calls on about `call_share` of sampled
first turns: a sampled group holds calls (reward 1) and direct answers (mostly 0), and GRPO has something to follow.
The decision is the first token ("<" of `<tool_call>` against "The"); greedy, the more likely one wins, so the
held-out eval (greedy) answers directly until RL has made the call the likelier first token.

Only the adapter ships (trainer/weights/smollm2-135m-tools-v<N>/, a few MB, with build.json); installing it merges
it onto the base built from the GGUF file (builtin:smollm2-135m-instruct) into a plain HF directory that vLLM and
transformers load. `python hack/ship-builtin.py --name builtin:smollm2-135m-tools` rebuilds and re-ships it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from rlscale.trainer.tasks import Problem
from rlscale.trainer.tools.calculator import calculate
from rlscale.trainer.tools.calls import format_call, observation_text
from rlscale.trainer.tools.prompt import chat_messages, tool_schema
from rlscale.trainer.tools.task import TASK, ToolArithmeticTask

MODEL = "builtin:smollm2-135m-tools"
BASE = "builtin:smollm2-135m-instruct"
SMOLLM2_TOOLS = {
    "kind": "lora-sft",
    "base": BASE,
    "task": TASK,
    "tool": "calculator",  # as examples/smollm2-tools.yaml names it: the name the system message and calls carry
    "call_share": 0.4,  # demonstrations that call; the rest answer directly
    "answer": "The answer is {}.",
    # peft's LoraConfig: rank 8 on the attention projections, 0.92M parameters (0.7% of the model).
    "lora": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0,
             "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
    "lr": 2e-3,
    "warmup": 5,
    "batch": 16,
    "steps": 60,
    "eval_size": 16,
    "seed": 0,
    "version": 1,
}
# What the shipped build holds (peft's adapter directory) and where a recipe's build keeps it in the cache entry.
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # what build.json's sha256 is of
ADAPTER_FILES = ("adapter_config.json", ADAPTER_WEIGHTS)
ADAPTER_DIR = "adapter"
# The base's files the merged model keeps as they are (the merged weights and config.json are written anew).
BASE_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


# --------------------------------------------------------------------------- demonstrations


def prompt_ids(tok: Any, problem: Problem, tool: str = "calculator") -> list[int]:
    """The prompt's tokens as a run with the calculator renders it (rlscale.trainer.data.render, no system prompt)."""
    msgs, extra = chat_messages([{"role": "user", "content": problem.prompt}], None, tok,
                                [tool_schema(tool, "calculator")])
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **extra)
    return tok(text, add_special_tokens=False).input_ids


def demonstration(tok: Any, problem: Problem, call: bool, answer: str = SMOLLM2_TOOLS["answer"],
                  tool: str = "calculator") -> tuple[list[int], list[int]]:
    """(ids, labels) of one trajectory as the run builds it: the prompt; with `call`, the call turn (ended by the
    model's <|im_end|>) and the calculator's answer as the observation the run appends (rlscale.trainer.tools.loop:
    each piece tokenized alone); then the answer turn. Labels: the model's tokens; -100 on the prompt and the
    observation."""
    ids = prompt_ids(tok, problem, tool)
    labels = [-100] * len(ids)

    def model_turn(text: str) -> None:
        turn = tok(text, add_special_tokens=False).input_ids + [tok.eos_token_id]
        ids.extend(turn)
        labels.extend(turn)

    if call:
        expression = problem.prompt.rstrip("=")
        model_turn(format_call(tool, {"expression": expression}))
        obs = tok(observation_text([calculate(expression)], tok), add_special_tokens=False).input_ids
        ids.extend(obs)
        labels.extend([-100] * len(obs))
    model_turn(answer.format(problem.answer))
    return ids, labels


def collate(rows: list[tuple[list[int], list[int]]], pad: int) -> dict[str, Any]:
    """A batch as the shared prefix (the longest common prefix of the rows, stopped before the position that
    predicts the first labelled token) and `parts`: the rows' suffixes grouped by length (a call's trajectory is
    three times a direct answer's; padding one to the other would waste most of the direct answers' compute),
    each part right-padded, with its mask and labels and the rows' indices."""
    import torch

    first = min(next(i for i, lab in enumerate(labels) if lab != -100) for _, labels in rows)
    p = 0
    while p < first - 1 and all(r[0][p] == rows[0][0][p] for r in rows):
        p += 1
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    groups: list[list[int]] = []
    for i in order:  # a new part where a row is over 1.5x the part's shortest suffix
        if not groups or len(rows[i][0]) - p > 1.5 * (len(rows[groups[-1][0]][0]) - p):
            groups.append([])
        groups[-1].append(i)
    parts = []
    for idx in groups:
        width = max(len(rows[i][0]) for i in idx) - p
        suffix, mask, labels = [], [], []
        for i in idx:
            ids, lab = rows[i]
            n = len(ids) - p
            suffix.append(ids[p:] + [pad] * (width - n))
            mask.append([1] * n + [0] * (width - n))
            labels.append(lab[p:] + [-100] * (width - n))
        parts.append({"rows": idx, "suffix": torch.tensor(suffix), "mask": torch.tensor(mask),
                      "labels": torch.tensor(labels)})
    return {"prefix": torch.tensor(rows[0][0][:p]), "parts": parts}


def prefix_kv(body: Any, prefix: Any) -> list[tuple[Any, Any]]:
    """Each layer's keys and values of the shared prefix, from one forward pass (with their gradients)."""
    cache = body(input_ids=prefix[None], use_cache=True).past_key_values
    return [(k, v) for k, v, *_ in cache]


def suffix_hidden(body: Any, kv: list[tuple[Any, Any]], part: dict[str, Any]) -> Any:
    """The last hidden states of a part's suffixes after the shared prefix, its keys and values repeated per row."""
    import torch
    from transformers import DynamicCache

    b, p = part["suffix"].shape[0], kv[0][0].shape[2]
    cache = DynamicCache([(k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1)) for k, v in kv])
    mask = torch.cat([torch.ones(b, p, dtype=part["mask"].dtype), part["mask"]], dim=1)
    return body(input_ids=part["suffix"], attention_mask=mask, past_key_values=cache, use_cache=True).last_hidden_state


def shared_prefix_loss(causal_lm: Any, batch: dict[str, Any]) -> Any:
    """The mean cross-entropy of the labelled tokens, the shared prefix run once (its keys and values repeated for
    every row, gradients flowing back through them): the same loss as the whole sequences' (tested), at a fraction
    of the compute, since every demonstration starts with the same ~165-token system message. Logits only where a
    label is (the 49k-wide head is a fifth of the model's compute per position)."""
    import torch

    body, head = causal_lm.model, causal_lm.lm_head
    kv = prefix_kv(body, batch["prefix"])
    total, count = 0.0, 0
    for part in batch["parts"]:
        hidden = suffix_hidden(body, kv, part)
        # Position j predicts token j + 1; a suffix's first token has no label (collate stops the prefix early).
        targets = part["labels"][:, 1:]
        keep = targets != -100
        logits = head(hidden[:, :-1][keep])
        total = total + torch.nn.functional.cross_entropy(logits.float(), targets[keep], reduction="sum")
        count += int(keep.sum())
    return total / count


def draw_batch(tok: Any, problems: list[Problem], rng: np.random.Generator, recipe: dict) -> dict[str, Any]:
    """A training batch: each problem a call demonstration with probability call_share, else a direct answer."""
    rows = [demonstration(tok, p, bool(rng.random() < recipe["call_share"]), recipe["answer"], recipe["tool"])
            for p in problems]
    return collate(rows, tok.pad_token_id)


# --------------------------------------------------------------------------- training and checks


def call_decision(causal_lm: Any, tok: Any, problems: list[Problem], tool: str = "calculator") -> tuple[float, float]:
    """(the mean probability of the call's first token as the first response token, the share of problems whose
    greedy first token is it) over `problems`: how often sampled and greedy first turns start a call."""
    import torch

    from rlscale.trainer.tools.calls import CALL_OPEN

    first = tok(CALL_OPEN, add_special_tokens=False).input_ids[0]
    # Labelling the prompt's last token keeps it out of the shared prefix: its hidden state predicts the first
    # response token.
    rows = [(ids, [-100] * (len(ids) - 1) + [first]) for ids in (prompt_ids(tok, p, tool) for p in problems)]
    batch = collate(rows, tok.pad_token_id)
    probs = []
    with torch.no_grad():
        kv = prefix_kv(causal_lm.model, batch["prefix"])
        for part in batch["parts"]:
            hidden = suffix_hidden(causal_lm.model, kv, part)
            last = part["mask"].sum(1) - 1
            probs.append(torch.softmax(causal_lm.lm_head(hidden[torch.arange(len(last)), last]).float(), dim=-1))
    probs = torch.cat(probs)
    return float(probs[:, first].mean()), float((probs.argmax(-1) == first).float().mean())


def forced_calls(causal_lm: Any, tok: Any, problems: list[Problem], tool: str = "calculator") -> float:
    """The share of problems whose greedy first turn, begun with `<tool_call>`, is the right call (the format)."""
    import torch

    from rlscale.trainer.tools.calls import CALL_OPEN, parse_tool_calls

    opener = tok(CALL_OPEN, add_special_tokens=False).input_ids
    right = 0
    for p in problems:  # one at a time: no padding to get wrong; a few dozen short generations
        ids = torch.tensor([prompt_ids(tok, p, tool) + opener])
        with torch.no_grad():
            out = causal_lm.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=40,
                                     eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        text = CALL_OPEN + tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        calls = parse_tool_calls(text, {tool: None})
        right += (len(calls) == 1 and calls[0].error is None
                  and calls[0].arguments.get("expression") == p.prompt.rstrip("="))
    return right / len(problems)


def train_adapter(out_dir: Path, recipe: dict, base_dir: Path, progress) -> dict:
    """Run the recipe: the adapter (peft's directory) into out_dir; returns the build's record. `progress`: the
    builder's progress context (rlscale.trainer.builtin._progress), which yields report(text, evaluated, step)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlscale.trainer.lora.policy import ADAPTER, wrap
    from rlscale.trainer.tasks import PromptIterator

    start = time.perf_counter()
    torch.manual_seed(recipe["seed"])
    rng = np.random.default_rng(recipe["seed"])
    tok = AutoTokenizer.from_pretrained(str(base_dir))
    model = wrap(AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32), dict(recipe["lora"]))
    causal_lm = model.get_base_model()
    task = ToolArithmeticTask(seed=recipe["seed"])
    held = task.eval[: recipe["eval_size"]]
    before = call_decision(causal_lm, tok, held, recipe["tool"])
    data = PromptIterator(task.train, seed=recipe["seed"])
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=recipe["lr"], weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / recipe["warmup"]))
    losses: list[float] = []
    with progress as report:
        for step in range(1, recipe["steps"] + 1):
            model.train()
            loss = shared_prefix_loss(causal_lm, draw_batch(tok, data.next_batch(recipe["batch"]), rng, recipe))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
            report(f"warm-starting {MODEL}: step {step}/{recipe['steps']}, loss {losses[-1]:.3f}",
                   step % 5 == 0 or step == recipe["steps"], step)
        model.eval()
        report(f"warm-starting {MODEL}: checking {len(held)} held-out prompts", True, recipe["steps"])
        prob, greedy = call_decision(causal_lm, tok, held, recipe["tool"])
        forced = forced_calls(causal_lm, tok, held, recipe["tool"])
    model.peft_config[ADAPTER].base_model_name_or_path = recipe["base"]  # not this machine's cache path
    model.save_pretrained(out_dir, safe_serialization=True)
    tail = losses[-10:]
    return {"steps": recipe["steps"], "loss_first": round(losses[0], 4), "loss": round(sum(tail) / len(tail), 4),
            "call_probability_before": round(before[0], 4), "call_probability": round(prob, 4),
            "greedy_call_share": greedy, "forced_call_accuracy": forced,
            "seconds": round(time.perf_counter() - start, 1), "recipe": json.loads(json.dumps(recipe)),
            "built_by_pid": os.getpid()}


def merge_adapter(out_dir: Path, adapter_dir: Path, base_dir: Path) -> dict:
    """The base with the adapter merged into its weights, saved as a plain HF directory (no peft needed to load it)
    beside the base's tokenizer, chat template and generation config; the adapter is kept in out_dir/adapter/."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(out_dir, safe_serialization=True)
    for name in BASE_FILES:
        if (base_dir / name).is_file():
            shutil.copyfile(base_dir / name, out_dir / name)
    keep = out_dir / ADAPTER_DIR
    if adapter_dir.resolve() != keep.resolve():
        keep.mkdir(exist_ok=True)
        for name in ADAPTER_FILES:
            shutil.copyfile(adapter_dir / name, keep / name)
    return {"base": str(base_dir), "merge_seconds": round(time.perf_counter() - start, 1)}
