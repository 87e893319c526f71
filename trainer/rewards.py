"""Verifiable reward functions, by name or as a plug-in `module:function`.

A reward function is `fn(prompt: str, completion: str, answer: str, *, finished: bool) -> float`
where `completion` is the decoded response without special tokens and `finished`
says whether the response ended with EOS (rather than running out of tokens).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable

RewardFn = Callable[..., float]

_NUMBER = re.compile(r"-?\d+")


def exact_match(prompt: str, completion: str, answer: str, *, finished: bool) -> float:
    """1 when the response is exactly the answer's digits followed by EOS, else 0."""
    return 1.0 if finished and completion == answer else 0.0


def format_reward(prompt: str, completion: str, answer: str, *, finished: bool) -> float:
    """1 when the response is a number followed by EOS, whatever its value, else 0."""
    return 1.0 if finished and _NUMBER.fullmatch(completion) is not None else 0.0


def exact_match_with_format(prompt: str, completion: str, answer: str, *, finished: bool) -> float:
    """Exact match plus a small bonus (0.1) for a well-formed answer: a denser signal early on."""
    return exact_match(prompt, completion, answer, finished=finished) + 0.1 * format_reward(
        prompt, completion, answer, finished=finished
    )


REWARDS: dict[str, RewardFn] = {
    "exact-match": exact_match,
    "format": format_reward,
    "exact-match+format": exact_match_with_format,
}


def resolve_reward(name: str) -> RewardFn:
    """A builtin reward by name, or `package.module:function` imported from the environment."""
    if name in REWARDS:
        return REWARDS[name]
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"spec.task.reward: {name!r} is neither a builtin reward ({', '.join(REWARDS)}) "
            "nor 'module:function'; use one of those"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"spec.task.reward: {name!r}: module {module_name!r} cannot be imported ({exc}); "
            "install it or put it on PYTHONPATH"
        ) from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(
            f"spec.task.reward: {name!r}: {module_name} has no callable {attr!r}; "
            "define fn(prompt, completion, answer, *, finished) -> float"
        )
    return fn


def score(
    fn: RewardFn, prompts: list[str], completions: list[str], answers: list[str], finished: list[bool]
) -> list[float]:
    """Apply a reward function to a batch; rejects non-numeric rewards by name."""
    out = []
    for p, c, a, f in zip(prompts, completions, answers, finished, strict=True):
        r = fn(p, c, a, finished=f)
        try:
            out.append(float(r))
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"reward function {getattr(fn, '__name__', fn)!r} returned {r!r} for prompt {p!r}; "
                "it must return a float"
            ) from exc
    return out
