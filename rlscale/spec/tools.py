"""spec.task's multi-turn fields: the tools a model may call (builtin or plug-in); their rules are
rlscale.spec.tool_rules, the loop rlscale.trainer.tools."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rlscale.spec.base import _Model

BUILTIN_TOOLS = ("calculator", "python")
TOOL_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$"
PLUGIN_RE = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"
DEFAULT_TOOL_TURNS = 4  # task.maxTurns with tools or an environment and no maxTurns


class ToolSpec(_Model):
    """One tool the model may call, Hermes-style (<tool_call>{"name": ..., "arguments": {...}}</tool_call>).
    Every call runs in a sandboxed worker process (docs/tools.md)."""

    name: str = Field(pattern=TOOL_NAME_RE, max_length=64, description="The name the model calls it by.")
    builtin: Literal["calculator", "python"] | None = Field(None, description="calculator (arguments: "
                                                            "{expression}: + - * / // % ** on numbers) or python "
                                                            "(arguments: {code}; prints and a last expression's "
                                                            "value are the output).")
    function: str | None = Field(None, pattern=PLUGIN_RE, description="A plug-in module:function called with the "
                                 "call's arguments as keywords, returning text (other values are sent as JSON).")
    timeout_seconds: float = Field(5.0, gt=0, le=600, description="Wall-clock seconds one call may take (and its CPU "
                                   "seconds); past it the worker is killed and replaced, and the model reads an error.")
    max_output_chars: int = Field(2048, ge=16, le=1_000_000, description="Characters of output the model reads; "
                                  "the rest is cut with a note saying how much.")


def default_turns(task: Any) -> int:
    """task.maxTurns unset: DEFAULT_TOOL_TURNS with tools or an environment, else 1 (single-turn)."""
    return DEFAULT_TOOL_TURNS if task.tools or task.environment else 1
