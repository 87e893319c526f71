"""The tools in the prompt (rlscale.trainer.tools.prompt): the schemas, the template's `tools` where it has a tool
format, Hermes' system text where it has none (SmolLM2's plain ChatML), and the task's rendering through it."""

from __future__ import annotations

import json

import pytest

from rlscale.trainer.tools.calls import has_tool_format
from rlscale.trainer.tools.prompt import chat_messages, hermes_system, tool_schema

CHATML = ("{% for m in messages %}{% if loop.first and messages[0]['role'] != 'system' %}<|im_start|>system\n"
          "You are SmolLM<|im_end|>\n{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WITH_TOOLS = ("{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}{% endfor %}<|im_end|>\n"
              "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture()
def tok():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")))


def lookup(city: str, days: int = 1) -> str:
    """The weather in a city.

    More detail that the schema leaves out."""
    return city * days


def test_schemas_of_a_builtin_and_a_plugin():
    calc = tool_schema("calculator", "calculator")["function"]
    assert calc["name"] == "calculator" and calc["parameters"]["required"] == ["expression"]
    fn = tool_schema("weather", function=lookup)["function"]
    assert fn["description"] == "The weather in a city."
    assert fn["parameters"]["properties"] == {"city": {"type": "string"}, "days": {"type": "integer"}}
    assert fn["parameters"]["required"] == ["city"]


def test_template_tool_format_detection(tok):
    assert not has_tool_format(tok)  # no template
    tok.chat_template = CHATML
    assert not has_tool_format(tok)
    tok.chat_template = WITH_TOOLS
    assert has_tool_format(tok)


def test_a_template_without_a_tool_format_gets_hermes_system_text(tok):
    tok.chat_template = CHATML
    schemas = [tool_schema("calculator", "calculator")]
    msgs, extra = chat_messages([{"role": "user", "content": "347*58="}], "Use the tool.", tok, schemas)
    assert extra == {}
    assert msgs[0]["role"] == "system" and msgs[0]["content"].startswith("Use the tool.\n\n")
    assert json.dumps(schemas[0]["function"]) in msgs[0]["content"] and "<tool_call>" in msgs[0]["content"]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert "You are SmolLM" not in text and "<tools>" in text  # the tools replace the template's default system
    # No system prompt: the tools are the system message; no tools: the messages as they were.
    msgs, _ = chat_messages([{"role": "user", "content": "x"}], None, tok, schemas)
    assert msgs[0]["content"] == hermes_system(schemas)
    assert chat_messages([{"role": "user", "content": "x"}], None, tok, []) == ([{"role": "user", "content": "x"}], {})


def test_a_template_with_a_tool_format_gets_the_tools_list(tok):
    tok.chat_template = WITH_TOOLS
    schemas = [tool_schema("calculator", "calculator")]
    msgs, extra = chat_messages([{"role": "user", "content": "347*58="}], None, tok, schemas)
    assert msgs == [{"role": "user", "content": "347*58="}] and extra == {"tools": schemas}
    assert '"name": "calculator"' in tok.apply_chat_template(msgs, tokenize=False, **extra)


def test_the_smollm2_example_renders_the_tools_into_its_system_message(tok):
    """examples/smollm2-tools.yaml through a tokenizer carrying SmolLM2-135M-Instruct's chat template (plain ChatML
    with a default system message, no tool format): every prompt holds the calculator's signature."""
    from rlscale.spec import load_rlrun
    from rlscale.trainer.data import Row, render, use_chat
    from tests.conftest import EXAMPLES

    tok.chat_template = CHATML
    spec = load_rlrun(EXAMPLES / "smollm2-tools.yaml").spec
    assert use_chat(spec.task, tok)
    (p,), dropped = render([Row(1, "347*58=", None, "20126", {})], tok, spec.task, True, 10**6)
    assert not dropped
    assert p.prompt.startswith("<|im_start|>system\nYou can call tools.") and '"name": "calculator"' in p.prompt
    assert p.prompt.endswith("<|im_start|>user\n347*58=<|im_end|>\n<|im_start|>assistant\n")
    assert "You are SmolLM" not in p.prompt
