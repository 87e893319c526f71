"""Trajectories turn by turn against the rollout replicas: generate, parse, call the tools (or step the
environment), append the observation, continue, with every unfinished trajectory of the batch in one
generate call per turn so the engines stay batched.

`MultiTurnRollout` wraps the run's rollout (rlscale.rollout.serve.RolloutClient, or a test's fake) behind the
same port (rlscale.trainer.ports.Rollout): the driver's step, DAPO's dynamic sampling and the held-out eval
call `generate` as for single-turn prompts and get trajectories back, each with its tokens (the model's and
the observations'), a mask (1 on the model's tokens: only they train; rlscale.trainer.batching.pack), the
sampler's logprobs (0.0 on observation tokens), and what it did: turns, tool calls, tool errors, seconds in
tools, the weights version of its last turn. A turn is one generate call that ends at EOS (the model's
end of turn) or at the turn's token limit; turn by turn (the default) the next waits for every trajectory's
observation, so a turn takes as long as its slowest tool call (bounded by the tools' timeouts); with
`overtake` (spec.task.overtakeTurns) each trajectory's next turn goes as soon as its own observation is in
(rlscale.trainer.tools.overtaking).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlscale.trainer.tools.environments import PluginEnvironments, ToolEnvironment, Turn
from rlscale.trainer.tools.overtaking import run_overtaking

log = logging.getLogger("rlscale.tools")
_TURN_SEED = 1_000_003  # each turn's seeds apart from the last's


@dataclass
class Trajectory:
    """One sample of a multi-turn rollout (it has what the driver reads of a rollout.engine.Sample)."""

    token_ids: list[int] = field(default_factory=list)  # every token after the prompt
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"  # "length": cut by the turn's tokens, the trajectory's budget or maxTurns
    mask: list[int] = field(default_factory=list)  # 1: the model's token; 0: an observation's
    text: str = ""  # the last model turn's text: what task.reward scores
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_seconds: float = 0.0  # summed over its calls
    tool_wall: float = 0.0  # its share of the wall seconds its turns waited for tools (the planner's figure)
    env_reward: float = 0.0
    turn_starts: list[int] = field(default_factory=list)  # where each model turn starts in token_ids
    turn_rewards: list[float] = field(default_factory=list)  # the environment's reward for each model turn
    weights_version: int = 0
    done: bool = False

    def add(self, tokens: Sequence[int], logprobs: Sequence[float] | None, model: bool) -> None:
        self.token_ids += list(tokens)
        self.mask += [1 if model else 0] * len(tokens)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(tokens)


class MultiTurnRollout:
    """The rollout port, multi-turn (see the module docstring); everything else is the inner rollout's."""

    def __init__(self, inner: Any, tokenizer: Any, *, max_turns: int, max_tokens: int, max_length: int,
                 tools: ToolEnvironment | None = None, environment: Callable[[], Any] | None = None,
                 environment_name: str = "", rows: Mapping[tuple, Mapping] | None = None, overtake: bool = False,
                 calls_in_flight: int = 1):
        object.__setattr__(self, "inner", inner)
        # overtake: each trajectory's next turn sent as soon as its answer is in, with at most calls_in_flight
        # generate calls out at once (overtaking.py); else turn by turn, every trajectory in each turn's call.
        self.overtake, self.calls_in_flight = overtake, max(1, int(calls_in_flight))
        self.tok, self.max_turns, self.max_tokens, self.max_length = tokenizer, max_turns, max_tokens, max_length
        self.tools, self.environment, self.environment_name = tools, environment, environment_name
        self.rows = rows or {}

    def __getattr__(self, name: str) -> Any:  # publish_weights, scale, sleep, serving, ...
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "on_behind":  # the driver's catch-up hook belongs to the client that calls it
            setattr(self.inner, name, value)
        else:
            object.__setattr__(self, name, value)

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], samples_per_prompt: int, *, temperature: float,
                 top_p: float, max_new_tokens: int, seed: int | None = None, version: int = 0) -> list[list[Any]]:
        prompts = [list(map(int, p)) for p in prompt_token_ids for _ in range(samples_per_prompt)]
        trajs = [Trajectory() for _ in prompts]
        envs = PluginEnvironments(self.environment, self.environment_name) if self.environment else None
        if envs is not None:
            for i, p in enumerate(prompts):
                self._observe(trajs[i], p, envs.reset(i, self.rows.get(tuple(p), {"prompt_ids": p})))
        sampling = {"temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens, "seed": seed,
                    "version": version}
        try:
            if self.overtake:
                run_overtaking(self, prompts, trajs, envs, **sampling)
            else:
                self._turn_by_turn(prompts, trajs, envs, **sampling)
        finally:
            if envs is not None:
                envs.close()
        return [trajs[k:k + samples_per_prompt] for k in range(0, len(trajs), samples_per_prompt)]

    def _turn_by_turn(self, prompts: list[list[int]], trajs: list[Trajectory], envs: PluginEnvironments | None,
                      **sampling: Any) -> None:
        """Every unfinished trajectory's turn in one generate call, then every observation, then the next turn."""
        for turn in range(self.max_turns):
            active = [i for i, t in enumerate(trajs) if not t.done]
            if not active:
                break
            texts = self._turn(prompts, trajs, active, turn, **sampling)
            going = [i for i in active if not trajs[i].done]
            t0 = time.perf_counter()
            answers = self.step(envs, going, [texts[i] for i in going])
            wall = (time.perf_counter() - t0) / max(1, len(going))
            for i, got in zip(going, answers, strict=True):
                self.answered(trajs[i], prompts[i], texts[i], got, wall)

    def step(self, envs: PluginEnvironments | None, keys: list[int], texts: list[str]) -> list[Turn]:
        """The environment's (or the tools') answers to these trajectories' turns."""
        if envs is not None:
            return envs.step_many(keys, texts)
        if self.tools is not None:
            return self.tools.step_many(texts)
        return [Turn("", done=True) for _ in keys]

    def answered(self, t: Trajectory, prompt: list[int], text: str, got: Turn, wall: float) -> None:
        """A trajectory's turn answered: its rewards and tool figures counted; it ends (done, or cut at maxTurns
        with a call left unanswered), or its observation is appended for the next turn."""
        t.text, t.env_reward = text, t.env_reward + got.reward
        t.turn_rewards[-1] += got.reward
        t.tool_calls += got.calls
        t.tool_errors += got.errors
        t.tool_seconds += got.tool_seconds
        t.tool_wall += wall
        if got.done:
            t.done = True
        elif t.turns >= self.max_turns:  # a call left unanswered: maxTurns cut it
            t.done, t.finish_reason = True, "length"
        else:
            self._observe(t, prompt, got.observation)

    @staticmethod
    def turn_seed(seed: int, turn: int, index: int) -> int:
        """Trajectory `index`'s seed at `turn` (0-based) when it goes alone or in order (overtaking.py)."""
        return seed + turn * _TURN_SEED + index

    def limit(self, prompt: list[int], t: Trajectory, max_new_tokens: int) -> int:
        """The next turn's token limit; a trajectory without room for one ends, cut (and gets 0)."""
        used = len(prompt) + len(t.token_ids)
        room = min(max_new_tokens, self.max_tokens - len(t.token_ids), self.max_length - used)
        if room <= 0:
            t.done, t.finish_reason = True, "length"
        return max(room, 0)

    def took_turn(self, t: Trajectory, s: Any, version: int) -> str:
        """A generated turn appended to its trajectory; returns its text."""
        t.turn_starts.append(len(t.token_ids))
        t.turn_rewards.append(0.0)
        t.add(s.token_ids, s.logprobs, model=True)
        t.turns += 1
        t.weights_version = int(getattr(s, "weights_version", version))
        text = self.tok.decode(s.token_ids, skip_special_tokens=True)
        if s.finish_reason == "length":  # cut inside the turn: no call is made from half a turn
            t.done, t.finish_reason, t.text = True, "length", text
        return text

    def _turn(self, prompts: list[list[int]], trajs: list[Trajectory], active: list[int], turn: int, *,
              temperature: float, top_p: float, max_new_tokens: int, seed: int | None, version: int) -> dict[int, str]:
        """One generate call per distinct token limit (most share one) for the active trajectories, in parallel;
        their turns appended; returns each one's text of the turn."""
        by_limit: dict[int, list[int]] = {}
        for i in active:
            limit = self.limit(prompts[i], trajs[i], max_new_tokens)
            if limit > 0:
                by_limit.setdefault(limit, []).append(i)

        def run(limit: int, idx: list[int]):
            s = None if seed is None else seed + turn * _TURN_SEED + min(idx)
            return self.inner.generate([prompts[i] + trajs[i].token_ids for i in idx], 1, temperature=temperature,
                                       top_p=top_p, max_new_tokens=limit, seed=s, version=version)

        texts: dict[int, str] = {}
        with ThreadPoolExecutor(max(1, len(by_limit))) as pool:
            outs = list(pool.map(lambda kv: run(*kv), by_limit.items()))
        for idx, groups in zip(by_limit.values(), outs, strict=True):
            for i, group in zip(idx, groups, strict=True):
                texts[i] = self.took_turn(trajs[i], group[0], version)
        return texts

    def _observe(self, t: Trajectory, prompt: list[int], text: str) -> None:
        """Append an observation's tokens; a trajectory without room for it and a next turn ends, cut."""
        if not text:
            return
        ids = self.tok(text, add_special_tokens=False).input_ids
        room = min(self.max_tokens - len(t.token_ids), self.max_length - len(prompt) - len(t.token_ids))
        if len(ids) >= room:
            t.done, t.finish_reason = True, "length"
            return
        t.add(ids, None, model=False)

    def close(self) -> None:
        if self.tools is not None:
            self.tools.pool.close()


def decode_samples(tok: Any, samples: Sequence[Any]) -> list[str]:
    """What the reward scores of each sample: a trajectory's last model turn, else the decoded response."""
    if samples and all(isinstance(getattr(s, "text", None), str) for s in samples):
        return [s.text for s in samples]
    return tok.batch_decode([s.token_ids for s in samples], skip_special_tokens=True)


def add_env_rewards(rewards: Sequence[float], samples: Sequence[Any]) -> list[float]:
    """task.reward's scores plus each sample's rewards from its environment's steps (a plug-in environment's)."""
    if not samples:
        return list(rewards)
    return [r + float(getattr(s, "env_reward", 0.0) or 0.0) for r, s in zip(rewards, samples, strict=True)]


def response_masks(samples: Sequence[Any]) -> list[list[int]] | None:
    """The samples' loss masks when any is multi-turn, else None (every response token is the model's)."""
    if not any(getattr(s, "mask", None) is not None for s in samples):
        return None
    return [list(s.mask) if getattr(s, "mask", None) is not None else [1] * len(s.token_ids) for s in samples]


def turn_credit_fields(samples: Sequence[Any]) -> dict[str, list]:
    """RolloutBatch's turn_starts and turn_rewards (spec.task.turnCredit rewardToGo): where each sample's model
    turns start and the environment's reward for each."""
    if any(not getattr(s, "turn_starts", None) for s in samples):
        raise ValueError("spec.task.turnCredit: rewardToGo needs each sample's turns (a multi-turn trajectory with "
                         "task.environment); this batch has samples without them (a batch generated by an older "
                         "version?); set turnCredit: trajectory to train it")
    return {"turn_starts": [list(s.turn_starts) for s in samples],
            "turn_rewards": [[float(r) for r in s.turn_rewards] for s in samples]}


def tool_metrics(samples: Sequence[Any]) -> dict[str, float]:
    """A step's tool figures (StepRecord.tools): per trajectory means of turns and tool calls, and totals of
    calls, errors, seconds in tools (summed over calls; wall_seconds: what the turns waited for them) and
    trajectories cut (by tokens or maxTurns); {} for single-turn samples."""
    trajs = [s for s in samples if getattr(s, "turns", None) is not None]
    if not trajs:
        return {}
    n = len(trajs)
    calls = sum(t.tool_calls for t in trajs)
    return {"turns": sum(t.turns for t in trajs) / n, "calls_per_trajectory": calls / n, "calls": float(calls),
            "errors": float(sum(t.tool_errors for t in trajs)), "seconds": sum(t.tool_seconds for t in trajs),
            "wall_seconds": sum(t.tool_wall for t in trajs),
            "truncated": float(sum(t.finish_reason == "length" for t in trajs)),
            "with_calls": sum(t.tool_calls > 0 for t in trajs) / n}
