"""Multi-turn rollouts with tools and environments (spec.task.tools, spec.task.environment, spec.task.maxTurns).

Modules: calls (parsing the model's tool calls, Hermes-style `<tool_call>{json}</tool_call>`, and the
observation that goes back), prompt (the tools in a chat prompt: the template's `tools`, or Hermes-style
system text), calculator (the builtin calculator), worker (the sandboxed process a tool
call runs in), sandbox (the pool of workers: timeouts, kill and replace), environments (the plug-in
environment and the tool environment behind one interface), loop (trajectories turn by turn against
the rollout; overtaking: each trajectory's next turn as soon as its own answer is in), credit (per-turn
credit, spec.task.turnCredit), task (the builtin tool task and its warm start). Importing this package imports no torch.
"""
