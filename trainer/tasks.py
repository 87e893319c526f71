"""Builtin verifiable tasks generated in code, and a checkpointable prompt iterator."""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

EVAL_SIZE = 500


@dataclass(frozen=True)
class Problem:
    """One prompt and the answer a verifier checks against.

    `prompt` is the text the model is given (after any system prompt and chat template);
    `prompt_ids` its tokens when a task has rendered it for a tokenizer (else the driver
    tokenizes `prompt`); `extra` the row's fields handed to a plug-in reward.
    """

    prompt: str
    answer: str
    extra: Mapping = field(default_factory=dict, compare=False, hash=False, repr=False)
    prompt_ids: tuple[int, ...] | None = field(default=None, compare=False, hash=False, repr=False)


# Difficulty levels of builtin:arithmetic. Level 1 is the calibrated one: 2-digit
# addition with operands 10-99, 8,100 problems = 7,600 train + 500 held out.
LEVELS = {
    0: "1-digit addition (operands 0-9)",
    1: "2-digit addition (operands 10-99)",
    2: "2-digit addition and subtraction with a non-negative result",
    3: "3-digit addition (operands 100-999)",
}


# Subtraction pairs of level 2 (a in 10-99, b in 10..a): where each a's run of b starts.
_SUB_START = np.cumsum([0] + [a - 9 for a in range(10, 99)])


def _count(level: int) -> int:
    sizes = {0: 10 * 10, 1: 90 * 90, 2: 90 * 90 + int(_SUB_START[-1]) + 90, 3: 900 * 900}
    if level not in sizes:
        raise ValueError(
            f"task difficulty: {level} is not a level of builtin:arithmetic; use one of {sorted(LEVELS)}"
        )
    return sizes[level]


def _problem(level: int, i: int) -> Problem:
    """The i-th problem of a level, in the order the levels list them (a major, b minor; level 2:
    level 1's sums, then the differences)."""
    if level == 2 and i >= 8100:
        j = i - 8100
        k = int(np.searchsorted(_SUB_START, j, side="right")) - 1
        a, b = 10 + k, 10 + j - int(_SUB_START[k])
        return Problem(f"{a}-{b}=", str(a - b))
    lo, n = {0: (0, 10), 1: (10, 90), 2: (10, 90), 3: (100, 900)}[level]
    a, b = lo + i // n, lo + i % n
    return Problem(f"{a}+{b}=", str(a + b))


class _Problems(Sequence):
    """A level's problems in a given order, made when read: level 3 has 810,000 of them, and
    making them all up front took 5-13 s of every process that built the task (the unit test of
    its answers, `pytest --durations=40`), for the few thousand a run draws."""

    def __init__(self, level: int, order: np.ndarray):
        self.level, self.order = level, order

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [_problem(self.level, int(j)) for j in self.order[i]]
        return _problem(self.level, int(self.order[operator.index(i)]))


class ArithmeticTask:
    """builtin:arithmetic: a fixed, seeded train / held-out split of all problems of a level."""

    name = "builtin:arithmetic"

    def __init__(self, difficulty: int = 1, seed: int = 0, eval_size: int = EVAL_SIZE):
        n = _count(difficulty)
        # The split depends only on (difficulty, seed), so every process and every
        # resumed run sees the same held-out set.
        order = np.random.default_rng(seed).permutation(n)
        n_eval = min(eval_size, n // 5)
        self.difficulty = difficulty
        self.seed = seed
        self.eval = _Problems(difficulty, order[:n_eval])[:]
        self.train = _Problems(difficulty, order[n_eval:])


class PromptIterator:
    """Draws training prompts epoch by epoch in a seeded order; its position checkpoints exactly."""

    def __init__(self, problems: list[Problem], seed: int = 0):
        if not problems:
            raise ValueError("PromptIterator: the task has no training problems")
        self.problems = problems
        self.seed = seed
        self.epoch = 0
        self.index = 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        # Each epoch's order is a function of (seed, epoch) alone, so restoring
        # (epoch, index) reproduces the stream without replaying it.
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.problems))

    def next_batch(self, n: int) -> list[Problem]:
        """The next n problems, crossing into a new shuffled epoch when one runs out."""
        out = []
        while len(out) < n:
            if self.index == len(self._order):
                self.epoch += 1
                self.index = 0
                self._order = self._epoch_order(self.epoch)
            take = min(n - len(out), len(self._order) - self.index)
            out.extend(self.problems[i] for i in self._order[self.index : self.index + take])
            self.index += take
        return out

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.index = int(state["index"])
        self._order = self._epoch_order(self.epoch)
