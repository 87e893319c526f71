"""The model's tool calls and the observations that answer them.

Hermes-style (Qwen2.5's, NousResearch's and most open chat templates'): a call is
`<tool_call>{"name": "calculator", "arguments": {"expression": "123*456"}}</tool_call>` in the
assistant's text, and the answer is the template's `tool` message, or `<tool_response>...</tool_response>`
where the model has no template. Parsing never raises: whatever the model wrote that is not a
call the run can make (no JSON, no name, a tool that does not exist, an unclosed tag) becomes a call
with an `error`, which the loop answers with an observation saying so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
MAX_CALLS_PER_TURN = 8
_TOOL_FORMAT_RE = re.compile(r"\btools\b|tool_call|['\"]tool['\"]")
_CALL_RE = re.compile(re.escape(CALL_OPEN) + r"(.*?)(" + re.escape(CALL_CLOSE) + r"|$)", re.S)


@dataclass
class ToolCall:
    """One call as the model wrote it: the tool's name and arguments, or `error` when it cannot be made."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    raw: str = ""


def parse_tool_calls(text: str, tools: dict[str, Any] | None = None) -> list[ToolCall]:
    """Every `<tool_call>` in `text`, in order (at most MAX_CALLS_PER_TURN are made; the rest are errors).
    With `tools` (name -> anything), a call naming another tool is an error listing the names."""
    calls = []
    for m in _CALL_RE.finditer(text):
        body, closed = m.group(1).strip(), bool(m.group(2))
        call = _one(body) if closed else ToolCall("", error=f"the tool call is not closed with {CALL_CLOSE}")
        call.raw = m.group(0)
        if call.error is None and tools is not None and call.name not in tools:
            call.error = f"there is no tool named {call.name!r}; the tools are {', '.join(sorted(tools))}"
        if len(calls) >= MAX_CALLS_PER_TURN and call.error is None:
            call.error = f"more than {MAX_CALLS_PER_TURN} tool calls in one turn; this one was not made"
        calls.append(call)
    return calls


def _one(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except ValueError as exc:
        return ToolCall("", error=f"the tool call is not JSON ({exc.msg} at character {exc.pos}); write "
                        '{"name": "<tool>", "arguments": {...}}')
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return ToolCall("", error='the tool call has no "name"; write {"name": "<tool>", "arguments": {...}}')
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI's wire format carries the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return ToolCall(obj["name"], error='"arguments" is a string that is not a JSON object')
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCall(obj["name"], error=f'"arguments" must be an object, not {type(args).__name__}')
    return ToolCall(obj["name"], args)


def format_call(name: str, arguments: dict[str, Any]) -> str:
    """A call as the model should write it (the warm start's demonstrations, the docs' examples)."""
    return CALL_OPEN + json.dumps({"name": name, "arguments": arguments}) + CALL_CLOSE


def has_tool_format(tokenizer: Any) -> bool:
    """Whether the model's chat template defines a tool format (takes a `tools` list or renders tool calls
    or the tool role), as Qwen2.5's does; plain ChatML (SmolLM2's) does not."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and bool(_TOOL_FORMAT_RE.search(template))


def observation_text(outputs: list[str], tokenizer: Any = None) -> str:
    """The text that follows the model's turn: the tools' outputs as the chat template's `tool` messages
    and the next assistant header, or `<tool_response>` blocks for a model without a template (or whose
    template has no tool role). A template without a tool format gets Hermes' `tool` messages: each output
    in a `<tool_response>` block (the form the Hermes system prompt, rlscale.trainer.tools.prompt, names)."""
    blocks = [f"{RESPONSE_OPEN}{o}{RESPONSE_CLOSE}" for o in outputs]
    if getattr(tokenizer, "chat_template", None):
        contents = outputs if has_tool_format(tokenizer) else blocks
        rendered = _template_delta(tokenizer, contents)
        # A template that drops messages of a role it does not know renders no output: then the plain blocks.
        if rendered is not None and all(o in rendered for o in contents):
            return rendered
    return "".join(blocks)


def _template_delta(tokenizer: Any, outputs: list[str]) -> str | None:
    """What the template adds after an assistant turn for the tool messages, with the next assistant
    header: the rendering of [user, tool...] + generation prompt past the rendering of [user]."""
    user = [{"role": "user", "content": "x"}]
    tool = [{"role": "tool", "content": o} for o in outputs]
    try:
        base = tokenizer.apply_chat_template(user, tokenize=False)
        full = tokenizer.apply_chat_template(user + tool, tokenize=False, add_generation_prompt=True)
    except Exception:  # a template that refuses the tool role
        return None
    if not isinstance(base, str) or not isinstance(full, str) or not full.startswith(base):
        return None
    # The model's turn ended with its end-of-turn token; the template puts a newline after it.
    return ("\n" if base.endswith("\n") else "") + full[len(base):]
