"""spec.task's multi-turn rules (checked in Python and emitted as CEL, like rules.py's): each tool one kind and
one name, turns need something to answer them, tools or an environment, a trajectory budget a turn fits, per-turn
credit where it can be carried out."""

from __future__ import annotations

from typing import Any

from rlscale.spec.rule_base import Rule, _cel_list, _err
from rlscale.spec.tools import BUILTIN_TOOLS

PER_TOKEN_RETURNS = ("ppo", "reinforce++")  # per-token returns, discounted by algorithm.gamma


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


def _rule_sandbox_needs_tools(s: Any):
    t = s.task
    if t.tool_sandbox is not None and not t.tools:
        return _err("task.toolSandbox", t.tool_sandbox.model_dump(mode="json", by_alias=True, exclude_none=True),
                    "is set, but there are no task.tools to run in it", "add task.tools, or remove task.toolSandbox")


def _rule_pod_fields_need_pods(s: Any):
    box = s.task.tool_sandbox
    if box is None or box.isolation == "pod":
        return None
    if box.runtime_class_name is not None:
        return _err("task.toolSandbox.runtimeClassName", box.runtime_class_name, "is set, but "
                    "task.toolSandbox.isolation is process: tool processes run in the learner pod, under its runtime",
                    "set task.toolSandbox.isolation: pod, or remove runtimeClassName")
    if box.replicas is not None:
        return _err("task.toolSandbox.replicas", box.replicas, "is set, but task.toolSandbox.isolation is "
                    "process (there are no tool pods)", "set task.toolSandbox.isolation: pod, or remove replicas")
    return None


def _rule_turn_credit(s: Any):
    t = s.task
    if t.turn_credit == "trajectory":
        return None
    if not t.environment:
        return _err("task.turnCredit", t.turn_credit, "credits per-turn rewards, but there is no task.environment "
                    "to give them (tools give none: every turn before the last would get the trajectory's reward)",
                    "set task.environment to a class whose step() returns per-turn rewards, or remove turnCredit")
    if s.algorithm.name == "gspo":
        return _err("task.turnCredit", t.turn_credit, "cannot be expressed by algorithm.name gspo: GSPO has one "
                    "importance ratio and so one advantage per sequence, not one per turn",
                    "use algorithm.name grpo (token ratios, the same group baseline), or remove turnCredit")
    return None


def _rule_turn_discount(s: Any):
    t, name = s.task, s.algorithm.name
    if t.turn_discount == 1.0:
        return None
    if t.turn_credit != "rewardToGo":
        return _err("task.turnDiscount", t.turn_discount, "discounts the turns' returns, but task.turnCredit is "
                    "trajectory (one reward per trajectory)", "set task.turnCredit: rewardToGo, or remove turnDiscount")
    if name in PER_TOKEN_RETURNS:
        return _err("task.turnDiscount", t.turn_discount, f"is not used by algorithm.name {name}, which discounts "
                    "per token with algorithm.gamma", "remove turnDiscount and set algorithm.gamma")
    return None


def _rule_overtake_needs_turns(s: Any):
    t = s.task
    if t.overtake_turns and (t.max_turns or 1) <= 1:
        return _err("task.overtakeTurns", True, "is set, but a trajectory has one turn (task.maxTurns "
                    f"{t.max_turns}): there is no next turn to send early", "raise task.maxTurns with task.tools or "
                    "task.environment, or remove overtakeTurns")


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
        Rule("task.toolSandbox", "!has(self.task.toolSandbox) || (has(self.task.tools) && size(self.task.tools) > 0)",
             "task.toolSandbox needs task.tools", _rule_sandbox_needs_tools),
        Rule("task.toolSandbox", "!has(self.task.toolSandbox) || (has(self.task.toolSandbox.isolation) && "
             "self.task.toolSandbox.isolation == 'pod') || (!has(self.task.toolSandbox.runtimeClassName) && "
             "!has(self.task.toolSandbox.replicas))",
             "task.toolSandbox.runtimeClassName and replicas need task.toolSandbox.isolation: pod",
             _rule_pod_fields_need_pods),
        Rule("task.turnCredit", "self.task.turnCredit == 'trajectory' || (has(self.task.environment) && "
             "self.algorithm.name != 'gspo')", "task.turnCredit rewardToGo needs task.environment and an algorithm "
             "other than gspo", _rule_turn_credit),
        Rule("task.turnDiscount", "self.task.turnDiscount == 1.0 || (self.task.turnCredit == 'rewardToGo' && "
             f"!(self.algorithm.name in {_cel_list(PER_TOKEN_RETURNS)}))", "task.turnDiscount needs task.turnCredit "
             "rewardToGo and a group algorithm (ppo and reinforce++ discount with algorithm.gamma)",
             _rule_turn_discount),
        Rule("task.overtakeTurns", "!self.task.overtakeTurns || (has(self.task.maxTurns) && self.task.maxTurns > 1) "
             "|| (has(self.task.tools) && size(self.task.tools) > 0) || has(self.task.environment)",
             "task.overtakeTurns needs more than one turn (task.tools or task.environment)",
             _rule_overtake_needs_turns),
    ]
