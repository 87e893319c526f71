"""spec.task's multi-turn fields: the tools a model may call (builtin or plug-in); their rules are
rlscale.spec.tool_rules, the loop rlscale.trainer.tools."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

import rlscale.spec.syntax as X
from rlscale.spec.base import _Model

BUILTIN_TOOLS = ("calculator", "python")
TOOL_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$"
PLUGIN_RE = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"
DEFAULT_TOOL_TURNS = 4  # task.maxTurns with tools or an environment and no maxTurns
TURN_CREDITS = ("trajectory", "rewardToGo")  # task.turnCredit (docs/tools.md, "Credit per turn")
# task.toolSandbox.isolation "pod": the tool pods' HTTP port, and the learner pods' variable naming the tool
# Service's URL (the operator sets it; rlscale.trainer.tools.setup reads it).
TOOL_SERVER_PORT = 8700
TOOL_SERVER_ENV = "RLSCALE_TOOL_SERVER"
MAX_TOOL_PODS = 16
# Worker processes a tool pod runs when task.toolWorkers is 0 (a pod's CPUs are its node's: one per core
# could be a hundred).
POD_TOOL_WORKERS = 2


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


class ToolSandboxSpec(_Model):
    """Where the tool workers run (docs/tools.md, "Tool pods"). process: sandboxed worker processes beside
    the driver (in the learner pod on Kubernetes). pod (Kubernetes): the workers in pods of their own, under
    the RuntimeClass the cluster admin allows (gVisor, Kata), with no egress; the driver calls them over
    HTTP, with the same per-call timeout and output limit. `rlscale run` on one machine runs processes."""

    isolation: Literal["process", "pod"] = Field("process", description="process: worker processes beside the "
                                                 "driver; pod: tool-worker pods (Kubernetes) the driver calls over "
                                                 "HTTP.")
    runtime_class_name: str | None = Field(None, min_length=1, max_length=X.DNS_SUBDOMAIN_MAX,
                                           pattern=X.DNS_SUBDOMAIN_RE, description="The tool pods' RuntimeClass "
                                           "(isolation pod), e.g. gvisor or kata; the cluster admin must allow it "
                                           "(chart value policy.runtimeClassNames). Unset: the node's default "
                                           "runtime.")
    # No default in the schema: the API server would fill it in, and the rule that only isolation pod takes it
    # could no longer tell a spec that set it.
    replicas: int | None = Field(None, ge=1, le=MAX_TOOL_PODS, description="Tool pods (isolation pod; unset: 1); "
                                 "each runs task.toolWorkers worker processes.")


def pods(task: Any) -> bool:
    """Whether the run's tools run in tool-worker pods (task.toolSandbox.isolation pod)."""
    return bool(task.tools) and task.tool_sandbox is not None and task.tool_sandbox.isolation == "pod"


def default_turns(task: Any) -> int:
    """task.maxTurns unset: DEFAULT_TOOL_TURNS with tools or an environment, else 1 (single-turn)."""
    return DEFAULT_TOOL_TURNS if task.tools or task.environment else 1
