"""Builtin verifiable tasks generated in code, and a checkpointable prompt iterator."""

from __future__ import annotations

from collections.abc import Mapping
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


def _enumerate(level: int) -> list[Problem]:
    if level == 0:
        return [Problem(f"{a}+{b}=", str(a + b)) for a in range(10) for b in range(10)]
    if level == 1:
        return [Problem(f"{a}+{b}=", str(a + b)) for a in range(10, 100) for b in range(10, 100)]
    if level == 2:
        add = _enumerate(1)
        sub = [Problem(f"{a}-{b}=", str(a - b)) for a in range(10, 100) for b in range(10, a + 1)]
        return add + sub
    if level == 3:
        return [Problem(f"{a}+{b}=", str(a + b)) for a in range(100, 1000) for b in range(100, 1000)]
    raise ValueError(
        f"task difficulty: {level} is not a level of builtin:arithmetic; use one of {sorted(LEVELS)}"
    )


class ArithmeticTask:
    """builtin:arithmetic: a fixed, seeded train / held-out split of all problems of a level."""

    name = "builtin:arithmetic"

    def __init__(self, difficulty: int = 1, seed: int = 0, eval_size: int = EVAL_SIZE):
        problems = _enumerate(difficulty)
        # The split depends only on (difficulty, seed), so every process and every
        # resumed run sees the same held-out set.
        order = np.random.default_rng(seed).permutation(len(problems))
        n_eval = min(eval_size, len(problems) // 5)
        self.difficulty = difficulty
        self.seed = seed
        self.eval = [problems[i] for i in order[:n_eval]]
        self.train = [problems[i] for i in order[n_eval:]]


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
