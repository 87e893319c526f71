"""Tool-call parsing (never raises: a malformed call becomes an error the model reads), the calculator, and the
observation text."""

from __future__ import annotations

import pytest

from rlscale.trainer.tools.calculator import CalculatorError, calculate
from rlscale.trainer.tools.calls import MAX_CALLS_PER_TURN, format_call, observation_text, parse_tool_calls

TOOLS = {"calculator": None, "python": None}


def test_a_hermes_call_is_parsed_with_its_arguments():
    text = "let me compute " + format_call("calculator", {"expression": "123*456"}) + " then answer"
    (call,) = parse_tool_calls(text, TOOLS)
    assert (call.name, call.arguments, call.error) == ("calculator", {"expression": "123*456"}, None)


def test_openai_style_string_arguments_and_parameters_are_accepted():
    (a,) = parse_tool_calls('<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"1+1\\"}"}</tool_call>')
    (b,) = parse_tool_calls('<tool_call>{"name": "python", "parameters": {"code": "2"}}</tool_call>')
    assert a.arguments == {"code": "1+1"} and b.arguments == {"code": "2"}


@pytest.mark.parametrize("text, says", [
    ("<tool_call>{not json}</tool_call>", "not JSON"),
    ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
    ('<tool_call>["calculator"]</tool_call>', 'no "name"'),
    ('<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>', "must be an object"),
    ('<tool_call>{"name": "search", "arguments": {}}</tool_call>', "no tool named 'search'"),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}', "not closed"),
    ("<tool_call></tool_call>", "not JSON"),
])
def test_malformed_calls_become_errors_not_exceptions(text, says):
    (call,) = parse_tool_calls(text, TOOLS)
    assert call.error is not None and says in call.error


def test_text_without_calls_has_none_and_too_many_calls_are_refused():
    assert parse_tool_calls("12345", TOOLS) == []
    many = "".join(format_call("calculator", {"expression": f"{i}+1"}) for i in range(MAX_CALLS_PER_TURN + 2))
    calls = parse_tool_calls(many, TOOLS)
    assert len(calls) == MAX_CALLS_PER_TURN + 2
    assert [c.error is None for c in calls] == [True] * MAX_CALLS_PER_TURN + [False, False]


@pytest.mark.parametrize("expr, value", [("123*456", "56088"), ("7/2", "3.5"), ("6/3", "2"), ("-(2+3)**2", "-25"),
                                         ("2^10", "1024"), ("17 % 5", "2")])
def test_calculator(expr, value):
    assert calculate(expr) == value


@pytest.mark.parametrize("expr, says", [("9**9**9", "exponent"), ("1/0", "division by zero"),
                                        ("__import__('os')", "not arithmetic"), ("", "empty"), ("1+", "cannot parse"),
                                        ("'a'*3", "not arithmetic"), ("(10**60)*(10**60)", "digits")])
def test_calculator_refuses_what_is_not_bounded_arithmetic(expr, says):
    with pytest.raises(CalculatorError, match=says):
        calculate(expr)


def test_observation_without_a_template_is_a_tool_response_block():
    assert observation_text(["56088", "error: x"]) == "<tool_response>56088</tool_response><tool_response>error: x" \
                                                       "</tool_response>"


def test_observation_with_a_chat_template_is_the_templates_tool_message():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")))
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    # Plain ChatML defines no tool format (SmolLM2's): Hermes' tool message, the output in <tool_response>.
    assert observation_text(["42"], tok) == ("\n<|im_start|>tool\n<tool_response>42</tool_response><|im_end|>\n"
                                             "<|im_start|>assistant\n")
    # A template with a tool format renders the output its own way (Qwen2.5's wraps it itself).
    tok.chat_template = ("{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>"
                         "{{ m.content }}</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n"
                         "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert observation_text(["42"], tok) == ("\n<|im_start|>user\n<tool_response>42</tool_response><|im_end|>\n"
                                             "<|im_start|>assistant\n")
