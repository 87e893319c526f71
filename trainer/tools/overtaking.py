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
    sampling = {"temperature": temperature, "top_p": top_p, "version": version}
    _Dispatcher(mt, prompts, trajs, envs, sampling, max_new_tokens, seed).run()


class _Dispatcher:
    """The state of one batch's overtaking loop: which trajectories wait for a turn (`ready`), which are with
    their tools or environment (`with_tools`), how many generate calls are out; the events they answer with."""

    def __init__(self, mt: Any, prompts: list[list[int]], trajs: list[Any], envs: PluginEnvironments | None,
                 sampling: dict[str, Any], max_new_tokens: int, seed: int | None):
        self.mt, self.prompts, self.trajs, self.envs = mt, prompts, trajs, envs
        self.sampling, self.max_new_tokens, self.seed = sampling, max_new_tokens, seed
        self.events: queue.Queue = queue.Queue()
        self.ready = [i for i, t in enumerate(trajs) if not t.done]
        self.with_tools: set[int] = set()
        self.out = 0  # generate calls out
        self.call_s = 0.0  # how long the last generate call took: the longest a ready trajectory waits for others
        self.ready_since = self.last_answer = time.perf_counter()

    def run(self) -> None:
        generating = ThreadPoolExecutor(self.mt.calls_in_flight, thread_name_prefix="rlscale-turns")
        stepping = ThreadPoolExecutor(1 if self.envs is not None else max(1, min(len(self.trajs), TOOL_THREADS)),
                                      thread_name_prefix="rlscale-steps")
        try:
            while self.ready or self.with_tools or self.out:
                wait = None  # how long to wait for an event: None, until one comes
                if self.ready and self.out < self.mt.calls_in_flight:
                    now = time.perf_counter()
                    wait = min(GATHER_S - (now - self.last_answer), self.call_s - (now - self.ready_since)) \
                        if self.with_tools else 0.0
                if wait is not None and wait <= 0:  # the ready trajectories go
                    self._send(generating)
                else:
                    self._take(self._events(wait), stepping)
        finally:
            generating.shutdown(wait=True, cancel_futures=True)
            stepping.shutdown(wait=True, cancel_futures=True)

    def _send(self, generating: ThreadPoolExecutor) -> None:
        """Every ready trajectory's next turn, in one call per distinct token limit."""
        by_limit: dict[int, list[int]] = {}
        for i in self.ready:
            limit = self.mt.limit(self.prompts[i], self.trajs[i], self.max_new_tokens)
            if limit > 0:
                by_limit.setdefault(limit, []).append(i)
        self.ready = []
        for limit, idx in by_limit.items():
            seeds = None if self.seed is None else [self.mt.turn_seed(self.seed, self.trajs[i].turns, i) for i in idx]
            generating.submit(self._call, idx, [self.prompts[i] + self.trajs[i].token_ids for i in idx], limit, seeds)
            self.out += 1

    def _call(self, idx: list[int], contexts: list[list[int]], limit: int, seeds: list[int] | None) -> None:
        try:
            t0 = time.perf_counter()
            groups = self.mt.inner.generate(contexts, 1, max_new_tokens=limit, seed=seeds, **self.sampling)
            self.events.put(("turns", (idx, groups, time.perf_counter() - t0)))
        except BaseException as exc:  # noqa: BLE001 - raised again by the dispatcher
            self.events.put(("error", exc))

    def _step(self, i: int, text: str) -> None:
        try:
            self.events.put(("answer", (i, text, self.mt.step(self.envs, [i], [text])[0])))
        except BaseException as exc:  # noqa: BLE001 - raised again by the dispatcher
            self.events.put(("error", exc))

    def _events(self, wait: float | None) -> list[tuple[str, Any]]:
        """The next event and whatever came in with it ([] when `wait` ran out: the gather is over); the wait
        counted as the tool wall of the trajectories with their tools while no call was out."""
        idle = list(self.with_tools) if not self.out else []
        t0 = time.perf_counter()
        try:
            got = [self.events.get(timeout=wait)]
        except queue.Empty:
            got = []
        while not self.events.empty():  # whatever came in together goes out together
            got.append(self.events.get_nowait())
        for i in idle:
            self.trajs[i].tool_wall += (time.perf_counter() - t0) / len(idle)
        return got

    def _take(self, got: list[tuple[str, Any]], stepping: ThreadPoolExecutor) -> None:
        mt, trajs = self.mt, self.trajs
        for kind, payload in got:
            if kind == "error":
                raise payload
            if kind == "turns":
                self.out -= 1
                idx, groups, self.call_s = payload
                for i, group in zip(idx, groups, strict=True):
                    text = mt.took_turn(trajs[i], group[0], self.sampling["version"])
                    if not trajs[i].done:
                        self.with_tools.add(i)
                        stepping.submit(self._step, i, text)
                continue
            i, text, answer = payload
            self.with_tools.discard(i)
            mt.answered(trajs[i], self.prompts[i], text, answer, 0.0)
            self.last_answer = time.perf_counter()
            if not trajs[i].done:
                if not self.ready:
                    self.ready_since = self.last_answer
                self.ready.append(i)
