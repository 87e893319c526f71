"""Trajectories that overtake each other across turns (MultiTurnRollout(overtake=True)): each trajectory's next
turn goes to the rollout as soon as its own observation is in, instead of after every trajectory's, so one slow
tool call holds back its own trajectory and not the batch.

The calling thread is the dispatcher. Whenever trajectories wait for a turn and fewer than `calls_in_flight`
generate calls are out, it sends all of them (one call per distinct token limit, as the turn-by-turn loop does),
so the engine still sees many sequences at once: the whole batch at the first turn, and later those whose answers
came in together. "Together" is a short gather: a call goes when no trajectory is still with its tools, when no
answer came in for GATHER_S, or when the first one waiting has waited as long as the last generate call took. A
call sent for the first answer alone would hold the engine for a whole call while the answers just behind it
wait (measured: with every tool call taking the same 0.5 s, sending at once made the batch 10% slower than turn
by turn, `bench/multiturn.py --tool-latency 1 --tool-spread equal`); waiting longer than a call takes cannot
gain more than it costs. The answers (generated turns, tool outputs, environment steps) come back as events on one
queue; everything that touches a trajectory or the tokenizer runs in the dispatcher.

- Tools: each trajectory's calls go to the tool pool from a thread of its own (the pool's calls run in parallel,
  bounded by its workers). A plug-in environment's steps run one at a time on one thread, in order of arrival:
  the user's code is not asked to be thread-safe, as in the turn-by-turn loop.
- Seeds: one per trajectory and turn (MultiTurnRollout.turn_seed: the turn-by-turn loop's seed of the trajectory
  when every trajectory of the batch is in the call), passed to the rollout
  as one seed per prompt (rlscale.rollout.engine.prompt_seeds), so a trajectory draws the same tokens however
  the calls group it.
- tool_wall: the wall seconds the dispatcher waited with no generate call out while trajectories were with
  their tools, shared among those trajectories (the turn-by-turn loop's figure: what the batch waited for tools).
"""

from __future__ import annotations

import queue
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rlscale.trainer.tools.environments import PluginEnvironments

TOOL_THREADS = 64  # trajectories whose tool calls may be out at once (each thread waits on the pool's workers)
GATHER_S = 0.02  # a pause in the answers this long ends the gather (module docstring)


def run_overtaking(mt: Any, prompts: list[list[int]], trajs: list[Any], envs: PluginEnvironments | None, *,
                   temperature: float, top_p: float, max_new_tokens: int, seed: int | None, version: int) -> None:
    """Run every trajectory of `trajs` (MultiTurnRollout `mt`'s) to its end; see the module docstring."""
    events: queue.Queue = queue.Queue()
    ready = [i for i, t in enumerate(trajs) if not t.done]
    with_tools: set[int] = set()
    out = 0  # generate calls out
    call_s = 0.0  # how long the last generate call took: the longest a ready trajectory waits for others
    ready_since = last_answer = time.perf_counter()
    generating = ThreadPoolExecutor(mt.calls_in_flight, thread_name_prefix="rlscale-turns")
    stepping = ThreadPoolExecutor(1 if envs is not None else max(1, min(len(trajs), TOOL_THREADS)),
                                  thread_name_prefix="rlscale-steps")

    def call(idx: list[int], contexts: list[list[int]], limit: int, seeds: list[int] | None) -> None:
        try:
            t0 = time.perf_counter()
            groups = mt.inner.generate(contexts, 1, temperature=temperature, top_p=top_p, max_new_tokens=limit,
                                       seed=seeds, version=version)
            events.put(("turns", (idx, groups, time.perf_counter() - t0)))
        except BaseException as exc:  # noqa: BLE001 - raised again by the dispatcher
            events.put(("error", exc))

    def step(i: int, text: str) -> None:
        try:
            events.put(("answer", (i, text, mt.step(envs, [i], [text])[0])))
        except BaseException as exc:  # noqa: BLE001 - raised again by the dispatcher
            events.put(("error", exc))

    try:
        while ready or with_tools or out:
            wait = None  # how long to wait for an event: None, until one comes
            if ready and out < mt.calls_in_flight:
                now = time.perf_counter()
                wait = min(GATHER_S - (now - last_answer), call_s - (now - ready_since)) if with_tools else 0.0
            if wait is not None and wait <= 0:  # the ready trajectories go
                by_limit: dict[int, list[int]] = {}
                for i in ready:
                    limit = mt.limit(prompts[i], trajs[i], max_new_tokens)
                    if limit > 0:
                        by_limit.setdefault(limit, []).append(i)
                ready = []
                for limit, idx in by_limit.items():
                    seeds = None if seed is None else [mt.turn_seed(seed, trajs[i].turns, i) for i in idx]
                    generating.submit(call, idx, [prompts[i] + trajs[i].token_ids for i in idx], limit, seeds)
                    out += 1
                continue
            idle = list(with_tools) if not out else []
            t0 = time.perf_counter()
            try:
                got = [events.get(timeout=wait)]
            except queue.Empty:  # the gather is over: the ready trajectories go
                got = []
            while not events.empty():  # whatever came in together goes out together
                got.append(events.get_nowait())
            for i in idle:
                trajs[i].tool_wall += (time.perf_counter() - t0) / len(idle)
            for kind, payload in got:
                if kind == "error":
                    raise payload
                if kind == "turns":
                    out -= 1
                    idx, groups, call_s = payload
                    for i, group in zip(idx, groups, strict=True):
                        text = mt.took_turn(trajs[i], group[0], version)
                        if not trajs[i].done:
                            with_tools.add(i)
                            stepping.submit(step, i, text)
                else:
                    i, text, answer = payload
                    with_tools.discard(i)
                    mt.answered(trajs[i], prompts[i], text, answer, 0.0)
                    last_answer = time.perf_counter()
                    if not trajs[i].done:
                        if not ready:
                            ready_since = last_answer
                        ready.append(i)
    finally:
        generating.shutdown(wait=True, cancel_futures=True)
        stepping.shutdown(wait=True, cancel_futures=True)
