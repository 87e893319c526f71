"""DAPO's dynamic sampling (Yu et al. 2025), as spec.algorithm.dynamicSampling asks: a step keeps
generating until it holds N = batch.prompts groups whose rewards are not all equal, within
maxRounds generation rounds, and trains on those N groups only.

Round 1 is the driver's own generation of N prompts. Each further round draws new prompts from
the same iterator: as many as the missing groups divided by the share of mixed groups seen so far
in this step (at least the missing count, at most N; N when no group has been mixed yet). Every
generated sample counts in the run's samples and generated tokens (the driver records all of
them), and the further rounds' generation time counts in the step's generate phase. Past
maxRounds the step trains on the mixed groups it found; with none it hands the first round over
unchanged, and the learner skips the step as it does for any batch without a mixed group.

"Mixed" is judged on the rewards the learner trains on: the task's plus DAPO's overlong
penalty when spec.algorithm.overlongBuffer is set (rlscale.trainer.advantages.training_rewards).
With per-turn credit (spec.task.turnCredit rewardToGo) a group whose trajectories end equal but
whose turns' returns differ at some turn index that two or more of its samples reached is mixed too:
those turns get advantages of their own (rlscale.trainer.tools.credit).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlscale.trainer.advantages import training_rewards
from rlscale.trainer.tools.credit import group_turn_advantages, turn_returns
from rlscale.trainer.tools.loop import decode_samples

log = logging.getLogger("rlscale.driver")


@dataclass
class Round:
    """Prompts and their samples, spp consecutive samples per prompt, as the driver's step holds them."""

    problems: list
    prompt_ids: list[list[int]]
    samples: list  # trainer.ports.Generated
    texts: list[str]
    finished: list[bool]
    rewards: list[float]

    def astuple(self) -> tuple:
        return self.problems, self.prompt_ids, self.samples, self.texts, self.finished, self.rewards

    def groups(self, keep: list[int], spp: int) -> Round:
        """The prompt groups `keep` (group numbers), in that order."""
        rows = [g * spp + j for g in keep for j in range(spp)]
        return Round([self.problems[g] for g in keep], [self.prompt_ids[g] for g in keep],
                     [self.samples[i] for i in rows], [self.texts[i] for i in rows],
                     [self.finished[i] for i in rows], [self.rewards[i] for i in rows])


def mixed_groups(rewards: list[float], lengths: list[int], spp: int, *, max_length: int, buffer: int,
                 factor: float, turn_rewards: list[list[float]] | None = None, discount: float = 1.0) -> list[int]:
    """The group numbers whose training rewards are not all equal or, given each sample's per-turn
    environment rewards (per-turn credit), whose turns' returns differ at a turn index two or more of
    its samples reached."""
    shaped = training_rewards(torch.tensor(rewards, dtype=torch.float32), torch.tensor(lengths),
                              max_length=max_length, buffer=buffer, factor=factor).view(-1, spp)
    mixed = ((shaped.max(dim=1).values - shaped.min(dim=1).values) > 0).tolist()
    if turn_rewards is not None:
        for g in range(len(mixed)):
            if not mixed[g]:
                returns = [turn_returns(float(shaped[g, j]), turn_rewards[g * spp + j], discount) for j in range(spp)]
                mixed[g] = group_turn_advantages(returns, spp, "centred")[1][0]  # the learner's own test
    return [g for g, m in enumerate(mixed) if m]


def next_round_prompts(wanted: int, have: int, seen: int, mixed_seen: int) -> int:
    """Prompts for the next round: the missing groups over the share of mixed groups seen so far,
    at least the missing count and at most a whole batch (`wanted`)."""
    missing = wanted - have
    if mixed_seen == 0:
        return wanted
    return max(missing, min(wanted, math.ceil(missing * seen / mixed_seen)))


class DynamicSampling:
    """Called by the driver's step after its first round is scored (see the module docstring)."""

    def __init__(self, spec: Any):
        a = spec.algorithm
        self.max_rounds = a.dynamic_sampling.max_rounds
        self.spp = spec.batch.samples_per_prompt
        ob = a.overlong_buffer
        self.shape = dict(max_length=spec.task.max_new_tokens, buffer=ob.length if ob else 0,
                          factor=ob.penalty_factor if ob else 1.0)
        self.last: dict[str, float] = {}  # the last step's rounds, generated groups and mixed groups
        self.per_turn = spec.task.turn_credit == "rewardToGo"
        self.discount = spec.task.turn_discount

    def _mixed(self, r: Round) -> list[int]:
        turns = [list(getattr(s, "turn_rewards", None) or []) for s in r.samples] if self.per_turn else None
        return mixed_groups(r.rewards, [len(s.token_ids) for s in r.samples], self.spp, **self.shape,
                            turn_rewards=turns, discount=self.discount)

    def __call__(self, driver: Any, first: Round, encode: Callable[[Any, Any], list[int]]) -> tuple[Round, list, float]:
        """(the step's round: at most N mixed groups, every sample generated this step, the further
        rounds' generation seconds); `encode(tokenizer, problem)` gives a prompt's tokens as the
        driver's first round has them."""
        wanted, spp = len(first.problems), self.spp
        parts = [first.groups(self._mixed(first), spp)]
        generated, seen, extra_s, rounds = list(first.samples), len(first.problems), 0.0, 1
        have = len(parts[0].problems)
        while have < wanted and rounds < self.max_rounds:
            more, seconds = draw(driver, encode, next_round_prompts(wanted, have, seen, have), rounds)
            generated += more.samples
            extra_s += seconds
            seen += len(more.problems)
            rounds += 1
            mixed = self._mixed(more)[: wanted - have]
            parts.append(more.groups(mixed, spp))
            have += len(mixed)
        self.last = {"rounds": rounds, "groups": seen, "mixed": have}
        if have < wanted:
            log.info("dynamic sampling: %d of %d groups with mixed rewards after %d rounds (%d groups generated)",
                     have, wanted, rounds, seen)
        if have == 0:
            return first, generated, extra_s
        return _concat(parts), generated, extra_s


def _concat(parts: list[Round]) -> Round:
    return Round(*[sum((list(getattr(p, f)) for p in parts), []) for f in
                   ("problems", "prompt_ids", "samples", "texts", "finished", "rewards")])


def draw(driver: Any, encode: Callable[[Any, Any], list[int]], prompts: int, round_index: int) -> tuple[Round, float]:
    """One further generation round of the driver's step: `prompts` new problems, generated as the
    step's first round is (same sampling settings and weights version, a seed of its own), decoded
    and scored; returns it with its generation seconds."""
    spec, at = driver.spec, driver.producing  # the batch's draw and weights version (trainer/pipeline.py)
    n = spec.batch.samples_per_prompt
    problems = driver.data.next_batch(prompts)
    prompt_ids = [encode(driver.tok, p) for p in problems]
    t0 = time.perf_counter()
    groups = driver.rollout.generate(prompt_ids, n, **spec.rollout.sampling(),
                                     max_new_tokens=spec.task.max_new_tokens,
                                     seed=at.step * 7919 + 17 + driver.seed * 1_000_003 + round_index * 104_729,
                                     version=at.version)
    seconds = time.perf_counter() - t0
    samples = [s for g in groups for s in g]
    texts = decode_samples(driver.tok, samples)
    finished = [s.finish_reason == "stop" for s in samples]
    rewards = driver._score(problems, n, texts, finished, samples)
    return Round(problems, prompt_ids, samples, texts, finished, rewards), seconds


def dynamic_sampling_for(spec: Any) -> DynamicSampling | None:
    """The step's refill when spec.algorithm.dynamicSampling is enabled, else None."""
    return DynamicSampling(spec) if spec.algorithm.dynamic_sampling.enabled else None
