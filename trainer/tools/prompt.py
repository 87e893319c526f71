"""The tools in the prompt: each tool's signature as a JSON schema (the `tools` list transformers' chat
templates take), given to a template that defines a tool format, or written Hermes-style into the system
message where the template has none (SmolLM2's, plain ChatML: it ignores a `tools` list, so the model would
never learn the tools exist).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from typing import Any

from rlscale.trainer.tools.calls import CALL_CLOSE, CALL_OPEN, RESPONSE_CLOSE, RESPONSE_OPEN, has_tool_format

_BUILTINS = {
    "calculator": ("Evaluates an arithmetic expression (+ - * / // % ** and parentheses on numbers) and returns "
                   "its value.", {"expression": {"type": "string", "description": "for example 347*58"}}),
    "python": ("Runs Python code and returns what it prints and the value of its last expression.",
               {"code": {"type": "string", "description": "Python source"}}),
}
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def tool_schema(name: str, builtin: str | None = None, function: Any = None) -> dict[str, Any]:
    """One tool's schema ({"type": "function", "function": {name, description, parameters}}): a builtin's
    own, or a plug-in function's from its signature (annotated types; parameters without a default are
    required) and the first paragraph of its docstring."""
    if builtin is not None:
        description, props = _BUILTINS[builtin]
        required = list(props)
    else:
        doc = inspect.getdoc(function) or ""
        description = doc.split("\n\n", 1)[0].replace("\n", " ")
        props, required = {}, []
        try:  # a module with `from __future__ import annotations` holds them as strings
            sig = inspect.signature(function, eval_str=True)
        except Exception:
            sig = inspect.signature(function)
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            props[p.name] = {"type": _JSON_TYPES.get(p.annotation, "string")}
            if p.default is p.empty:
                required.append(p.name)
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": required}}}


def tool_schemas(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """The schemas of spec.task.tools (plug-in functions imported as the workers import them)."""
    from rlscale.trainer.tools.plugins import import_object

    out = []
    for t in tools:
        fn = None if t.builtin else import_object(t.function, f"spec.task.tools[{t.name}].function")
        out.append(tool_schema(t.name, t.builtin, fn))
    return out


def hermes_system(schemas: Sequence[dict[str, Any]]) -> str:
    """The tools as Hermes-style system text: the signatures in <tools></tools> and how to call one."""
    sigs = "\n".join(json.dumps(s["function"]) for s in schemas)
    return (f"You can call tools. Their signatures:\n<tools>\n{sigs}\n</tools>\nTo call one, reply with "
            f'{CALL_OPEN}{{"name": <tool name>, "arguments": <JSON object>}}{CALL_CLOSE} and nothing else; '
            f"its result comes back in {RESPONSE_OPEN}{RESPONSE_CLOSE}. A reply without a call is your answer.")


def chat_messages(messages: list[dict[str, str]], system: str | None, tokenizer: Any,
                  schemas: Sequence[dict[str, Any]]) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """(messages, extra apply_chat_template arguments) for a prompt: the system prompt first, and the tools
    as the template's `tools` where it has a tool format, else appended to the system message Hermes-style
    (a template's own default system message is then replaced: the tools need one)."""
    msgs = list(messages)
    if system and msgs[0]["role"] != "system":
        msgs.insert(0, {"role": "system", "content": system})
    if not schemas:
        return msgs, {}
    if has_tool_format(tokenizer):
        return msgs, {"tools": list(schemas)}
    block = hermes_system(schemas)
    if msgs[0]["role"] == "system":
        msgs[0] = {"role": "system", "content": msgs[0]["content"] + "\n\n" + block}
    else:
        msgs.insert(0, {"role": "system", "content": block})
    return msgs, {}
