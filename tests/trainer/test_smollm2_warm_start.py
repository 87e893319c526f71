"""The warm start of builtin:smollm2-135m-tools (rlscale.trainer.tools.smollm2): its demonstrations are the run's
own trajectories token for token (the prompt as build_task renders it, the call, the calculator's observation as
the multi-turn loop appends it, the answer), the loss is on the model's turns only, the shared-prefix loss is the
whole sequences' loss, and the mix of calls and direct answers is the recipe's. The shipped adapter's real check
(installed, merged, calling) is the slow test at the end."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rlscale.trainer.tasks import Problem
from rlscale.trainer.tools.smollm2 import SMOLLM2_TOOLS, collate, demonstration, draw_batch, prompt_ids
from tests.conftest import EXAMPLES
from tests.trainer.test_tools_prompt import CHATML

PROBLEMS = [Problem("347*58=", "20126"), Problem("120*11=", "1320"), Problem("999*99=", "98901")]


@pytest.fixture(scope="module")
def chat_tok():
    """The tool task's character tokenizer with SmolLM2's chat template (plain ChatML, a default system message)
    and its special tokens, <|im_end|> ending a turn: each character a token, so every boundary shows."""
    from rlscale.trainer.tools.task import build_tokenizer

    tok = build_tokenizer()
    tok.add_special_tokens({"eos_token": "<|im_end|>", "additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = CHATML
    tok.model_max_length = 4096  # the demonstrations are ~550 characters
    return tok


def test_the_prompt_is_the_runs_rendering_of_the_example(chat_tok):
    from rlscale.spec import load_rlrun
    from rlscale.trainer.data import Row, render

    spec = load_rlrun(EXAMPLES / "smollm2-tools.yaml").spec
    assert spec.task.tools[0].name == SMOLLM2_TOOLS["tool"] and not spec.task.system_prompt
    rendered, _ = render([Row(i, p.prompt, None, p.answer, {}) for i, p in enumerate(PROBLEMS)], chat_tok,
                         spec.task, True, 10**6)
    assert [list(r.prompt_ids) for r in rendered] == [prompt_ids(chat_tok, p) for p in PROBLEMS]


class Replay:
    """The rollout port replaying a demonstration's model turns: each context it is sent must be the demonstration's
    tokens so far (what the loop built: prompt, turns, observations), and it writes the next labelled run."""

    def __init__(self, demo):
        self.demo = demo

    def generate(self, prompt_ids, n, *, max_new_tokens, **_):
        out = []
        ids, labels = self.demo
        for ctx in prompt_ids:
            assert ids[: len(ctx)] == list(ctx) and len(ids) > len(ctx)
            end = len(ctx)
            while end < len(ids) and labels[end] != -100:
                end += 1
            turn = ids[len(ctx):end]
            assert turn and turn[-1] == ids[end - 1] and len(turn) <= max_new_tokens
            out.append([SimpleNamespace(token_ids=turn, logprobs=[-0.1] * len(turn), finish_reason="stop")])
        return out


def test_demonstrations_are_the_multi_turn_loops_trajectories_with_the_model_turns_labelled(chat_tok):
    """The real loop and the real sandboxed calculator, the policy replaying the demonstrations: the trajectory's
    tokens are the demonstration's, and its mask (the model's tokens) is where the labels are."""
    from rlscale.trainer.tools.environments import ToolEnvironment
    from rlscale.trainer.tools.loop import MultiTurnRollout
    from rlscale.trainer.tools.sandbox import ToolDef, ToolPool

    cases = [(p, demonstration(chat_tok, p, call)) for p in PROBLEMS for call in (True, False)]
    pool = ToolPool([ToolDef("calculator", builtin="calculator")], workers=1)
    try:
        for problem, (ids, labels) in cases:
            loop = MultiTurnRollout(Replay((ids, labels)), chat_tok, max_turns=2, max_tokens=400, max_length=1000,
                                    tools=ToolEnvironment(pool, chat_tok))
            prompt = prompt_ids(chat_tok, problem)
            (traj,), = loop.generate([prompt], 1, temperature=1.0, top_p=1.0, max_new_tokens=200, seed=0)
            assert prompt + traj.token_ids == ids
            assert traj.mask == [int(lab != -100) for lab in labels[len(prompt):]]
            assert labels[: len(prompt)] == [-100] * len(prompt)
    finally:
        pool.close()
    call, direct = cases[0][1], cases[1][1]
    text = chat_tok.decode(call[0], skip_special_tokens=False)
    assert ('<tool_call>{"name": "calculator", "arguments": {"expression": "347*58"}}</tool_call><|im_end|>\n'
            "<|im_start|>tool\n<tool_response>20126</tool_response><|im_end|>\n<|im_start|>assistant\n"
            "The answer is 20126.<|im_end|>") in text
    labelled = chat_tok.decode([t for t, lab in zip(*call, strict=True) if lab != -100], skip_special_tokens=False)
    assert labelled == ('<tool_call>{"name": "calculator", "arguments": {"expression": "347*58"}}</tool_call>'
                        "<|im_end|>The answer is 20126.<|im_end|>")
    assert chat_tok.decode([t for t, lab in zip(*direct, strict=True) if lab != -100],
                           skip_special_tokens=True) == "The answer is 20126."


def test_collate_shares_the_prefix_up_to_the_position_before_the_first_label_and_groups_by_length():
    rows = [([1, 2, 3, 4, 5, 6], [-100, -100, -100, -100, 5, 6]),
            ([1, 2, 3, 9, 7], [-100, -100, -100, -100, 7]),
            ([1, 2, 3, 4, 8, 8, 8, 8, 8, 8], [-100, -100, -100, 4, 8, 8, 8, 8, 8, 8])]
    b = collate(rows, pad=0)
    # Rows share [1, 2, 3]; the third labels its 4th token, which the 3rd position predicts: the prefix stops at 2.
    assert b["prefix"].tolist() == [1, 2]
    # Suffixes of 4, 3 and 8 tokens: the 3 and 4 pad to each other, the 8 is a part of its own.
    first, second = b["parts"]
    assert first["rows"] == [1, 0] and second["rows"] == [2]
    assert first["suffix"].tolist() == [[3, 9, 7, 0], [3, 4, 5, 6]]
    assert first["mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert first["labels"].tolist() == [[-100, -100, 7, -100], [-100, -100, 5, 6]]
    assert second["suffix"].tolist() == [[3, 4, 8, 8, 8, 8, 8, 8]]
    assert second["labels"].tolist() == [[-100, 4, 8, 8, 8, 8, 8, 8]]
    # One row: everything but the position before its first label is prefix.
    assert collate(rows[:1], pad=0)["prefix"].tolist() == [1, 2, 3]


def test_the_recipe_calls_on_its_share_of_demonstrations(chat_tok):
    rng = np.random.default_rng(0)
    problems = [Problem(f"{a}*{b}=", str(a * b)) for a in range(100, 140) for b in range(10, 20)]
    calls = 0
    for k in range(0, len(problems), 50):
        batch = draw_batch(chat_tok, problems[k:k + 50], rng, SMOLLM2_TOOLS)
        assert sorted(i for part in batch["parts"] for i in part["rows"]) == list(range(50))
        for part in batch["parts"]:
            text = chat_tok.batch_decode(part["suffix"].tolist(), skip_special_tokens=False)
            calls += sum("<tool_call>" in t for t in text)
            # Every row is labelled somewhere after the shared prefix, none on its padding.
            labelled = part["labels"] != -100
            assert (labelled <= (part["mask"] == 1)).all() and labelled.any(1).all()
        # Calls and direct answers are parts of their own: padding is under a fifth of the suffixes' tokens.
        padded = sum(part["mask"].numel() for part in batch["parts"])
        assert sum(int(part["mask"].sum()) for part in batch["parts"]) > 0.8 * padded
    assert abs(calls / len(problems) - SMOLLM2_TOOLS["call_share"]) < 0.07  # 400 draws: 3 standard errors


def test_the_shared_prefix_loss_and_gradients_are_the_whole_sequences():
    """A tiny random Llama with a LoRA adapter: the loss with the prefix run once and its keys and values repeated
    equals the loss of the padded whole sequences, and so do the adapter's gradients."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlscale.trainer.lora.policy import wrap
    from rlscale.trainer.tools.smollm2 import shared_prefix_loss

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    model = wrap(LlamaForCausalLM(cfg), {**SMOLLM2_TOOLS["lora"], "init_lora_weights": False})
    lm = model.get_base_model()
    head = [5, 6, 7, 8, 9, 10, 11, 12]
    rows = [(head + [13, 14, 20, 21, 2], [-100] * 10 + [20, 21, 2]),
            (head + [15, 16, 17, 22, 23, 24, 2], [-100] * 11 + [22, 23, 24, 2]),
            (head + [18, 25, 2], [-100] * 9 + [25, 2])]
    batch = collate(rows, pad=2)
    assert len(batch["prefix"]) == 8 and len(batch["parts"]) == 2  # suffixes of 5, 7 and 3 tokens
    shared = shared_prefix_loss(lm, batch)
    shared.backward()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [p.grad.clone() for p in params]
    assert all(g.abs().sum() > 0 for g in grads)
    model.zero_grad()
    width = max(len(r[0]) for r in rows)
    ids = torch.tensor([r[0] + [2] * (width - len(r[0])) for r in rows])
    labels = torch.tensor([r[1] + [-100] * (width - len(r[1])) for r in rows])
    mask = torch.tensor([[1] * len(r[0]) + [0] * (width - len(r[0])) for r in rows])
    whole = lm(input_ids=ids, attention_mask=mask, labels=labels).loss
    whole.backward()
    assert torch.allclose(shared, whole, rtol=1e-5, atol=1e-6)
    for g, p in zip(grads, params, strict=True):
        assert torch.allclose(g, p.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # the base from the GGUF file (once per cache, 24 s) and the merge of the shipped adapter
def test_the_shipped_adapter_installs_merged_and_the_model_calls_the_calculator(tmp_path):
    """The package's adapter (trainer/weights/smollm2-135m-tools-v1/) is the current recipe's; installing it
    merges it onto the base into a plain HF directory; that model, on held-out prompts as the run renders them,
    writes the right call greedily once its turn begins with <tool_call>, and starts a call with a probability
    between the extremes (sampled first turns call sometimes, not always: GRPO's groups differ)."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlscale.trainer import builtin
    from rlscale.trainer.tools.smollm2 import ADAPTER_DIR, BASE, MODEL, call_decision, forced_calls
    from rlscale.trainer.tools.task import ToolArithmeticTask

    shipped = builtin.shipped_build(MODEL)
    assert shipped is not None, "trainer/weights/ holds no build of the current SMOLLM2_TOOLS recipe"
    base = builtin.ensure_builtin_model(BASE)  # the default cache's base, shared with the other SmolLM2 tests
    (tmp_path / base.name).symlink_to(base)
    path = builtin.ensure_builtin_model(MODEL, cache_dir=tmp_path, progress=False)
    marker = (path / builtin.MARKER).read_text()
    assert builtin.sha256_file(shipped / "adapter_model.safetensors") in marker
    assert not (path / "adapter_config.json").exists() and (path / ADAPTER_DIR / "adapter_config.json").is_file()
    name = "model.layers.0.self_attn.q_proj.weight"
    with safe_open(path / "model.safetensors", "pt") as merged, safe_open(base / "model.safetensors", "pt") as orig:
        assert not torch.equal(merged.get_tensor(name), orig.get_tensor(name))  # the adapter is in the weights
    tok = AutoTokenizer.from_pretrained(str(path))
    lm = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    held = ToolArithmeticTask().eval[:4]
    assert forced_calls(lm, tok, held) == 1.0
    prob, _ = call_decision(lm, tok, held)
    assert 0.1 < prob < 0.7
