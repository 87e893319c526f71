"""A run's multi-turn rollout from its spec (spec.task.tools / environment / maxTurns / maxTrajectoryTokens)."""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlscale.trainer.tools.environments import ToolEnvironment
from rlscale.trainer.tools.loop import MultiTurnRollout
from rlscale.trainer.tools.plugins import import_object
from rlscale.trainer.tools.remote import RemoteToolPool
from rlscale.trainer.tools.sandbox import ToolPool, tool_defs

log = logging.getLogger("rlscale.tools")


def tool_pool(spec: Any, env: Mapping[str, str] | None = None) -> ToolPool | RemoteToolPool:
    """The run's tool workers, started: the tool pods behind their Service (task.toolSandbox.isolation pod, the
    operator naming the Service in TOOL_SERVER_ENV), else sandboxed processes beside the driver (its first
    worker started here, so a plug-in tool that does not import stops the run before anything trains)."""
    from rlscale.spec.tools import TOOL_SERVER_ENV, pods

    t, env = spec.task, os.environ if env is None else env
    url = env.get(TOOL_SERVER_ENV, "")
    if pods(t) and url:
        remote = RemoteToolPool(tool_defs(spec), url, parallel=16 * (t.tool_sandbox.replicas or 1))
        how = remote.wait_ready()
        log.info("tools %s in the tool pods at %s (network cut by %s)", ", ".join(remote.tools), url,
                 " and ".join(sorted(how)) or "?")
        return remote
    if pods(t):
        log.warning("spec.task.toolSandbox.isolation is pod, but this run is not on Kubernetes (no %s): the tools "
                    "run in sandboxed processes beside the driver", TOOL_SERVER_ENV)
    from rlscale.trainer.reward_pool import default_workers

    pool = ToolPool(tool_defs(spec), workers=t.tool_workers or default_workers(), memory_mb=t.tool_memory_mb)
    first = pool.tools[next(iter(pool.tools))]
    pool.call(first.name, {})  # starts a worker: its tools import, or the run stops naming them
    isolation = pool.stats.isolation
    log.info("tools %s in %d sandboxed workers (network cut by %s)", ", ".join(pool.tools), pool.size,
             " and ".join(sorted(isolation)) or "?")
    return pool


def multi_turn(spec: Any, rollout: Any, tokenizer: Any, problems: Sequence[Any],
               encode: Callable[[Any, Any], list[int]]) -> MultiTurnRollout:
    """The run's rollout behind MultiTurnRollout: the tools' worker pool (its first worker started here, so a
    plug-in tool that does not import stops the run before anything trains), or the environment class."""
    t = spec.task
    tools = env = None
    if t.tools:
        pool = tool_pool(spec)
        atexit.register(pool.close)
        isolation = pool.take_stats().isolation
        if "netns" not in isolation:
            log.warning("tool workers could not enter a network namespace of their own (user namespaces are "
                        "disabled here): only the Python audit hook keeps sockets out (docs/tools.md)")
        tools = ToolEnvironment(pool, tokenizer)
    else:
        env = import_object(t.environment, "spec.task.environment")
    # An environment's reset(row) gets the problem's fields, found by the prompt's tokens (the rollout port's key).
    rows = {tuple(encode(tokenizer, p)): {"prompt": p.prompt, "answer": p.answer, **dict(p.extra)}
            for p in problems} if env is not None else {}
    max_tokens = t.max_trajectory_tokens or spec.model.max_length
    return MultiTurnRollout(rollout, tokenizer, max_turns=t.max_turns, max_tokens=max_tokens,
                            max_length=spec.model.max_length, tools=tools, environment=env,
                            environment_name=t.environment or "", rows=rows, overtake=t.overtake_turns)
