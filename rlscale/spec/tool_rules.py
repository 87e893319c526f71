"""spec.task's multi-turn rules (checked in Python and emitted as CEL, like rules.py's): each tool one kind and
one name, turns need something to answer them, tools or an environment, a trajectory budget a turn fits."""

from __future__ import annotations

from typing import Any

from rlscale.spec.rule_base import Rule, _err
from rlscale.spec.tools import BUILTIN_TOOLS


def _rule_one_kind(s: Any):
    for i, t in enumerate(s.task.tools or []):
        if (t.builtin is None) == (t.function is None):
            return _err(f"task.tools[{i}]", t.model_dump(mode="json", by_alias=True, exclude_none=True),
                        "must set exactly one of builtin and function", f"set builtin: {' or '.join(BUILTIN_TOOLS)}, "
                        "or function: module:function")


def _rule_unique_names(s: Any):
    names = [t.name for t in s.task.tools or []]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        return _err("task.tools", names, f"names {', '.join(dup)} more than once", "give every tool its own name")


def _rule_turns_need_tools(s: Any):
    t = s.task
    if (t.max_turns or 1) > 1 and not t.tools and not t.environment:
        return _err("task.maxTurns", t.max_turns, "is more than 1, but there are no task.tools and no "
                    "task.environment to answer a turn", "add task.tools or task.environment, or remove maxTurns")


def _rule_tools_or_environment(s: Any):
    t = s.task
    if t.tools and t.environment:
        return _err("task.environment", t.environment, "is set together with task.tools; an environment answers "
                    "every turn itself", "drop task.tools (call tools from the environment's step), or drop "
                    "task.environment")


def _rule_budget_fits(s: Any):
    t = s.task
    if t.max_trajectory_tokens is not None and t.max_trajectory_tokens < t.max_new_tokens:
        return _err("task.maxTrajectoryTokens", t.max_trajectory_tokens, f"is less than task.maxNewTokens "
                    f"({t.max_new_tokens}), so not even one turn fits", "raise it to at least task.maxNewTokens "
                    "times the turns you expect, plus their observations")


def tool_rules() -> list[Rule]:
    """Unique tool names; turns need something to answer them; tools or an environment; a budget for a turn."""
    return [
        Rule("task.tools", "!has(self.task.tools) || self.task.tools.all(t, has(t.builtin) != has(t.function))",
             "every task.tools entry sets exactly one of builtin and function", _rule_one_kind),
        Rule("task.tools", "!has(self.task.tools) || self.task.tools.all(a, self.task.tools.exists_one(b, "
             "b.name == a.name))", "task.tools must name every tool once", _rule_unique_names),
        Rule("task.maxTurns", "!has(self.task.maxTurns) || self.task.maxTurns <= 1 || "
             "(has(self.task.tools) && size(self.task.tools) > 0) || has(self.task.environment)",
             "task.maxTurns > 1 needs task.tools or task.environment",
             _rule_turns_need_tools),
        Rule("task.environment",
             "!has(self.task.environment) || !has(self.task.tools) || size(self.task.tools) == 0",
             "task.environment and task.tools are exclusive", _rule_tools_or_environment),
        Rule("task.maxTrajectoryTokens", "!has(self.task.maxTrajectoryTokens) || "
             "!has(self.task.maxNewTokens) || self.task.maxTrajectoryTokens >= self.task.maxNewTokens",
             "task.maxTrajectoryTokens must be at least task.maxNewTokens", _rule_budget_fits),
    ]
