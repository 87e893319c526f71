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

import re

import numpy as np

from rlscale.trainer.tasks import EVAL_SIZE, Problem
from rlscale.trainer.tools.calls import CALL_CLOSE, CALL_OPEN, RESPONSE_CLOSE, RESPONSE_OPEN

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
