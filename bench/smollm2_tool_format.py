"""Does SmolLM2-135M call the calculator as examples/smollm2-tools.yaml asks (its model, the warm start
builtin:smollm2-135m-tools, or another with --model, e.g. builtin:smollm2-135m-instruct: the model untouched)?

Samples the first turn of held-out prompts rendered exactly as the run renders them (build_task: the chat
template, the Hermes tool block in the system message) and counts the turns holding a valid call, and the valid
calls that compute the right product; `--one-shot` puts one demonstration (a call, the calculator's
`tool` message, the answer) before the question as chat turns. Then, greedy, whether the model copies the
calculator's result into its answer when its first turn is the right call (the second turn alone). HF generate in
this process, no vLLM; prints the counts so far after each prompt, then the totals.

    .venv/bin/python bench/smollm2_tool_format.py                      # 6 prompts x 8 samples
    .venv/bin/python bench/smollm2_tool_format.py --one-shot
    .venv/bin/python bench/smollm2_tool_format.py --model builtin:smollm2-135m-instruct   # before the warm start
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "smollm2-tools.yaml"


def one_shot(tok) -> str:
    """A demonstration as chat turns in the template's own rendering (a call, the calculator's `tool` message as
    the run writes it, the answer), to put before the question's user turn."""
    from rlscale.trainer.tools.calls import RESPONSE_CLOSE, RESPONSE_OPEN, format_call

    msgs = [{"role": "user", "content": "123*45="},
            {"role": "assistant", "content": format_call("calculator", {"expression": "123*45"})},
            {"role": "tool", "content": f"{RESPONSE_OPEN}5535{RESPONSE_CLOSE}"},
            {"role": "assistant", "content": "5535"}]
    text = tok.apply_chat_template(msgs, tokenize=False)
    return text[text.index("<|im_start|>user"):]  # without the template's default system message


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--one-shot", action="store_true")
    ap.add_argument("--model", help="a builtin name or model directory instead of the example's model.path")
    a = ap.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlscale.spec import load_rlrun
    from rlscale.trainer.builtin import ensure_builtin_model
    from rlscale.trainer.data import builtin_rows, render, use_chat
    from rlscale.trainer.rewards import exact_match
    from rlscale.trainer.tools.calculator import calculate
    from rlscale.trainer.tools.calls import CALL_OPEN, observation_text, parse_tool_calls
    from rlscale.trainer.tools.task import ToolArithmeticTask, call_text

    torch.manual_seed(0)
    spec = load_rlrun(EXAMPLE).spec
    model_path = a.model or spec.model.path
    path = ensure_builtin_model(model_path, progress=False) if model_path.startswith("builtin:") else Path(model_path)
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    # The run's rendering (build_task's) of the held-out rows only (not the 80,500 train prompts too).
    problems, _ = render(builtin_rows(spec.task)[1][: a.prompts], tok, spec.task, use_chat(spec.task, tok), 10**6)
    raw = ToolArithmeticTask().eval[: a.prompts]  # the same held-out problems, unrendered
    assert all(r.prompt in p.prompt for r, p in zip(raw, problems, strict=True))
    gen = dict(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, max_new_tokens=spec.task.max_new_tokens)
    n = calls = right_calls = tags = copied = direct = direct_right = 0
    t0 = time.perf_counter()
    for p, r in zip(problems, raw, strict=True):
        prompt = p.prompt
        if a.one_shot:  # the demonstration goes between the system message and the question
            head, user = prompt.rsplit("<|im_start|>user", 1)
            prompt = head + one_shot(tok) + "<|im_start|>user" + user
        ids = tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids.repeat(a.samples, 1), do_sample=True, temperature=1.0, top_p=1.0, **gen)
        for text in tok.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True):
            n += 1
            tags += CALL_OPEN in text
            ok = [c for c in parse_tool_calls(text, {"calculator": None}) if c.error is None]
            calls += bool(ok)
            if ok:
                try:
                    right_calls += calculate(str(ok[0].arguments.get("expression", ""))) == p.answer
                except ValueError:
                    pass
            elif CALL_OPEN not in text:  # an answer without a call: is it right (the product, by the model alone)?
                direct += 1
                direct_right += exact_match(p.prompt, text, p.answer) >= 1.0
        # The second turn alone: after the right call and the calculator's answer, is the result copied (greedy)?
        context = p.prompt + call_text(r) + tok.eos_token + observation_text([p.answer], tok)
        ids = tok(context, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            answer = tok.decode(model.generate(ids, do_sample=False, **gen)[0, ids.shape[1]:], skip_special_tokens=True)
        copied += exact_match(p.prompt, answer, p.answer) >= 1.0
        print(json.dumps({"prompts_so_far": problems.index(p) + 1, "samples": n, "valid_calls": calls,
                          "copied": copied}), flush=True)  # a loaded machine may time it out: what it got so far
    print(json.dumps({"samples": n, "with_tool_call_tag": tags, "valid_calls": calls, "right_calls": right_calls,
                      "direct_answers": direct, "direct_right": direct_right, "prompts": len(problems),
                      "copied_after_a_forced_right_call": copied, "one_shot": a.one_shot, "model": model_path,
                      "prompt_tokens": len(tok(problems[0].prompt, add_special_tokens=False).input_ids),
                      "seconds": round(time.perf_counter() - t0, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
