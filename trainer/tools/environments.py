"""What a trajectory talks to between the model's turns: a plug-in environment (spec.task.environment), or
the tools (spec.task.tools) behind the same interface.

A plug-in environment is a class, `module:Class`, made once per trajectory with no arguments:
`reset(row) -> str` (the first observation, put after the prompt; "" for none; `row` the problem's
fields: prompt, answer and the extra fields) and `step(action) -> (observation, reward, done)` (action:
the model's text of the turn). Its rewards add up to the trajectory's (with task.reward's score when
the spec sets one). Environments run in the driver's process: they are the user's code, trusted like a
reward plug-in; tools, which run what the model wrote, run in the sandboxed workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlscale.trainer.tools.calls import observation_text, parse_tool_calls
from rlscale.trainer.tools.sandbox import ToolPool, ToolResult


@dataclass
class Turn:
    """What the environment answered to one model turn."""

    observation: str  # text appended after the model's turn (empty when done)
    reward: float = 0.0
    done: bool = False
    calls: int = 0
    errors: int = 0
    tool_seconds: float = 0.0


class ToolEnvironment:
    """The tools as an environment: a turn with tool calls is answered with their outputs; a turn without
    one ends the trajectory (its text is the answer task.reward scores)."""

    def __init__(self, pool: ToolPool, tokenizer: Any = None):
        self.pool, self.tokenizer = pool, tokenizer

    def reset(self, row: Mapping) -> str:
        return ""

    def step_many(self, actions: list[str]) -> list[Turn]:
        """Every trajectory's turn at once: their calls go to the pool together (in parallel)."""
        parsed = [parse_tool_calls(a, self.pool.tools) for a in actions]
        todo = [(i, j, c) for i, calls in enumerate(parsed) for j, c in enumerate(calls) if c.error is None]
        done = self.pool.call_many([(c.name, c.arguments) for _, _, c in todo])
        results: dict[tuple[int, int], ToolResult] = {(i, j): r for (i, j, _), r in zip(todo, done, strict=True)}
        turns = []
        for i, calls in enumerate(parsed):
            if not calls:
                turns.append(Turn("", done=True))
                continue
            outs = [results.get((i, j)) or ToolResult(f"error: {c.error}", "refused") for j, c in enumerate(calls)]
            turns.append(Turn(observation_text([o.output for o in outs], self.tokenizer), calls=len(calls),
                              errors=sum(o.failed for o in outs), tool_seconds=sum(o.seconds for o in outs)))
        return turns


class PluginEnvironments:
    """One plug-in environment object per trajectory; each step called in the driver's process."""

    def __init__(self, factory: Any, name: str):
        self.factory, self.name = factory, name
        self.envs: dict[int, Any] = {}

    def reset(self, key: int, row: Mapping) -> str:
        env = self.envs[key] = self.factory()
        first = env.reset(dict(row))
        return "" if first is None else str(first)

    def step_many(self, keys: list[int], actions: list[str]) -> list[Turn]:
        out = []
        for key, action in zip(keys, actions, strict=True):
            got = self.envs[key].step(action)
            if not (isinstance(got, tuple) and len(got) == 3):
                raise ValueError(f"spec.task.environment: {self.name}.step returned {got!r}; return "
                                 "(observation, reward, done)")
            obs, reward, done = got
            out.append(Turn("" if obs is None else str(obs), float(reward or 0.0), bool(done)))
        return out

    def close(self) -> None:
        self.envs.clear()
