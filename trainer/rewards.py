"""Verifiable rewards: builtin verifiers, `module:function` plug-ins, and weighted sums of them.

`task.reward` is an expression: one term, or terms joined by `+`, each optionally weighted:

    exact-match                       1 when the extracted answer equals the reference answer
    math                              1 when math-verify finds the answers equivalent (1/2 == 0.5)
    format                            1 when the completion matches task.formatPattern
    mypkg.rewards:score               a plug-in function
    reward-model                      task.rewardModel's score of (prompt, completion) (trainer/reward_model.py)
    0.9*math + 0.1*format             a weighted sum

A plug-in is called as `fn(prompt, completion, answer, extra)` and returns a float:
`prompt` is the text the model was given (after the system prompt and chat template),
`completion` the decoded response without special tokens, `answer` the row's reference
answer as a string ('' when the dataset has none) and `extra` a dict of the row's other
fields. A plug-in may also declare a keyword parameter `finished` (True when the response
ended with EOS rather than running out of tokens); one with only three positional
parameters is called without `extra`. A plug-in whose signature names a `completions` parameter is a TRL-style
batched reward, `fn(prompts, completions, **columns) -> list[float]`, called once per batch
(trainer/reward_batched.py).

In a run, plug-ins, `math` and a `format` pattern of the spec's are called in worker processes
(trainer/reward_pool.py, Reward.start_pool), each call killed at task.rewardTimeout; exact-match and
the default format pattern run in the driver's process. The reward-model term is called once per batch
with all its pairs, which go to its Ray Serve replicas. Each term's mean is logged on its own.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlscale.spec import BUILTIN_REWARDS as BUILTIN_NAMES
from rlscale.spec import PLUGIN_REWARD_RE, PLUGINS_ENV, REWARD_EXPRESSION_RE, REWARD_MODEL_TERM
from rlscale.trainer.reward_errors import RewardError, RewardWorkerKilled  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)
DEFAULT_FORMAT_PATTERN = "-?[0-9]+"  # the spec's default task.formatPattern
DEFAULT_TIMEOUT_S = 10.0

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_HASHES = re.compile(r"####\s*([^\n]*)")


RewardFn = Callable[..., float]  # fn(prompt, completion, answer, extra=None, *, finished=True) -> float


# --------------------------------------------------------------------------- answer extraction


def _boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}), braces balanced."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i : j - 1] if depth == 0 else None


def extract_answer(text: str, last_number: bool = True) -> str:
    """The answer a text gives: after GSM8K's `####`, else inside the last `\\boxed{}`, else its
    last number (when `last_number`), else the whole text; stripped."""
    hashes = _HASHES.findall(text)
    if hashes:
        return hashes[-1].strip()
    boxed = _boxed(text)
    if boxed is not None:
        return boxed.strip()
    numbers = _NUMBER.findall(text) if last_number else []
    if numbers:
        return numbers[-1]
    return text.strip()


def _normalize(ans: str) -> str:
    ans = ans.strip().rstrip(".").strip().strip("$").strip()
    plain = ans.replace(",", "")
    try:
        value = float(plain)
    except ValueError:
        return ans
    return repr(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


# --------------------------------------------------------------------------- builtin verifiers


def exact_match(prompt: str, completion: str, answer: str, extra: Mapping | None = None,
                *, finished: bool = True) -> float:
    """1 when the completion's extracted answer equals the reference's (numbers compared as numbers), else 0.
    The reference is taken after `####` or from `\\boxed{}` when it has them, else as it is."""
    return (1.0 if _normalize(extract_answer(completion)) == _normalize(extract_answer(answer, last_number=False))
            else 0.0)


def math_equal(prompt: str, completion: str, answer: str, extra: Mapping | None = None,
               *, finished: bool = True) -> float:
    """1 when math-verify finds the completion's answer equivalent to the reference, else 0.

    math-verify's own timeouts use signal.alarm, which works only in the main thread; the
    caller (score) enforces task.rewardTimeout instead, so they are off here.
    """
    from math_verify import parse, verify

    # Without its alarm-based timeout math-verify warns on every call: score's timeout stands in.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    ref = _HASHES.findall(answer)
    gold = parse(ref[-1] if ref else answer, parsing_timeout=None)
    if not gold:  # a bare number or word the LaTeX parser does not take: wrap it
        gold = parse(f"${answer.strip()}$", parsing_timeout=None)
    hashes = _HASHES.findall(completion)
    pred = parse(hashes[-1] if hashes else completion, parsing_timeout=None)
    return 1.0 if gold and pred and verify(gold, pred, timeout_seconds=None) else 0.0


def format_match(pattern: str) -> Callable[..., float]:
    """A verifier: 1 when the whole stripped completion matches the regular expression, else 0."""
    rx = re.compile(pattern, re.DOTALL)

    def fmt(prompt: str, completion: str, answer: str, extra: Mapping | None = None, *, finished: bool = True) -> float:
        return 1.0 if rx.fullmatch(completion.strip()) else 0.0

    fmt.__name__ = "format"
    return fmt


def strict_match(prompt: str, completion: str, answer: str, extra: Mapping | None = None,
                 *, finished: bool = True) -> float:
    """1 when the response is exactly the answer followed by EOS (the builtin model's warm start)."""
    return 1.0 if finished and completion == answer else 0.0


# --------------------------------------------------------------------------- expressions and plug-ins


_TERM = re.compile(rf"^\s*(?:(\d+(?:\.\d+)?|\.\d+)\s*\*\s*)?({PLUGIN_REWARD_RE[1:-1]}|[a-z-]+)\s*$")


def parse_expression(expr: str) -> list[tuple[float, str]]:
    """[(weight, name)] of a reward expression; ValueError naming the term that is wrong."""
    terms = []
    parts = expr.split("+") if re.match(REWARD_EXPRESSION_RE, expr) else [expr]
    for part in parts:
        m = _TERM.match(part)
        if not m or (":" not in m.group(2) and m.group(2) not in (*BUILTIN_NAMES, REWARD_MODEL_TERM)):
            raise ValueError(
                f"spec.task.reward: {expr!r}: term {part.strip()!r} is neither a builtin reward "
                f"({', '.join(BUILTIN_NAMES)}), {REWARD_MODEL_TERM} nor module:function; write e.g. 'exact-match', "
                "'0.9*math + 0.1*format' or 'mypkg.rewards:score'"
            )
        terms.append((float(m.group(1)) if m.group(1) else 1.0, m.group(2)))
    return terms


@dataclass
class Term:
    weight: float
    name: str
    fn: Callable[..., Any]
    takes_extra: bool = True
    takes_finished: bool = True
    safe: bool = False  # known to end quickly (a builtin on fixed patterns): scored in the driver's process
    # Scores a whole batch in one call, batch(prompts, completions) -> floats (the reward-model term); then fn is None.
    batch: Any = None
    batched: bool = False  # a TRL-style plug-in, fn(prompts, completions, **columns) (trainer/reward_batched.py)

    def __call__(self, prompt: str, completion: str, answer: str, extra: Mapping, finished: bool) -> Any:
        if self.batch is not None:
            return self.batch([prompt], [completion])[0]
        if self.batched:  # one sample as a batch of one; None (does not apply) adds 0, as in a batch
            from rlscale.trainer.reward_batched import call

            return call(self, [(prompt, completion, answer, extra, finished)])[0] or 0.0
        args = (prompt, completion, answer, extra) if self.takes_extra else (prompt, completion, answer)
        return self.fn(*args, finished=finished) if self.takes_finished else self.fn(*args)


class RewardTally:
    """What the steps' scoring saw since the last step record: each term's values and the timeouts."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.timeouts = 0

    def add(self, scored: Scored) -> None:
        for name, values in scored.terms.items():
            self.sums[name] = self.sums.get(name, 0.0) + sum(values)
            self.counts[name] = self.counts.get(name, 0) + len(values)

    def take(self, reward: Reward) -> tuple[dict[str, float], int]:
        """({term: mean unweighted value}, calls killed at the timeout) since the last take; then reset."""
        means = {k: self.sums[k] / n for k, n in self.counts.items() if n}
        timeouts, self.timeouts = reward.timeouts - self.timeouts, reward.timeouts
        self.sums, self.counts = {}, {}
        return means, timeouts


@dataclass
class Reward:
    """A resolved reward expression: call it on one sample, or `score` a batch with a timeout."""

    expression: str
    terms: list[Term]
    timeout_s: float = DEFAULT_TIMEOUT_S
    format_pattern: str | None = None
    resolved: bool = False  # built by resolve_reward: a worker process builds it again from the expression
    timeout_score: float | None = None  # task.rewardTimeoutScore, with a pool (a thread cannot be killed)
    needs_answer: bool = field(init=False)
    pool: Any = field(default=None, repr=False, compare=False)  # trainer.reward_pool.RewardPool
    batch_pool: Any = field(default=None, repr=False, compare=False)  # the TRL-style terms' worker (one a batch)
    tally: RewardTally = field(default_factory=RewardTally, repr=False, compare=False)
    timeouts: int = 0  # calls killed at the timeout, over the run

    def __post_init__(self) -> None:
        self.needs_answer = any(t.name in ("exact-match", "math") for t in self.terms)

    def __call__(self, prompt: str, completion: str, answer: str, extra: Mapping | None = None,
                 *, finished: bool = True) -> float:
        return _check(self, prompt, completion,
                      sum(t.weight * as_float(t, t(prompt, completion, answer, extra or {}, finished),
                                              prompt, completion)
                          for t in self.terms))

    def start_pool(self, workers: int = 0, timeout_score: float | None = None) -> bool:
        """Score the terms not known to be safe (plug-ins, math, a format pattern of the spec's) in worker
        processes from now on, `workers` of them (0: one per core); once per run. False when every term
        runs in the driver's process (exact-match: the quickstart) or the reward was not resolved."""
        if self.pool is not None or self.batch_pool is not None:
            return True
        unsafe = [i for i, t in enumerate(self.terms) if not t.safe and t.batch is None and not t.batched]
        batched = [i for i, t in enumerate(self.terms) if t.batched]
        if not (unsafe or batched) or not self.resolved:
            return False
        from rlscale.trainer import reward_batched
        from rlscale.trainer.reward_pool import RewardPool, default_workers

        self.timeout_score = timeout_score
        if unsafe:
            self.pool = RewardPool(_pool_terms, _pool_call, (self.expression, self.format_pattern, unsafe),
                                   workers or default_workers(), self.timeout_s)
            log.info("reward %r: %s scored by %d worker processes", self.expression,
                     ", ".join(self.terms[i].name for i in unsafe), self.pool.size)
        if batched:  # one call a batch: one worker
            self.batch_pool = RewardPool(_pool_terms, reward_batched.pool_call,
                                         (self.expression, self.format_pattern, batched), 1, self.timeout_s)
            log.info("reward %r: %s (TRL-style, a call a batch) scored by a worker process", self.expression,
                     ", ".join(self.terms[i].name for i in batched))
        return True

    def close(self) -> None:
        """End the worker processes and the reward model's replicas (the run's end)."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.batch_pool is not None:
            self.batch_pool.close()
            self.batch_pool = None
        for t in self.terms:
            if t.batch is not None and hasattr(t.batch, "close"):
                t.batch.close()

    def without_batched(self) -> Reward | None:
        """The same reward without its batch terms (the reward-model term, which needs the run's Ray cluster), for
        a check before the run starts; None when no other term is left."""
        terms = [t for t in self.terms if t.batch is None]
        if not terms:
            return None
        return Reward(self.expression, terms, self.timeout_s, format_pattern=self.format_pattern)


@dataclass
class Scored:
    """A batch's rewards, and each term's unweighted values (none for a call killed at the timeout)."""

    rewards: list[float]
    terms: dict[str, list[float]]
    timeouts: int = 0

    def term_means(self) -> dict[str, float]:
        return {k: sum(v) / len(v) for k, v in self.terms.items() if v}


def _shown(text: str, n: int = 160) -> str:
    return repr(text if len(text) <= n else text[: n - 3] + "...")


def as_float(term: Term, value: Any, prompt: str, completion: str) -> float:
    if not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise RewardError(f"reward {term.name!r} returned {value!r} ({type(value).__name__}) "
                          f"for prompt {_shown(prompt)} and completion {_shown(completion)}; it must return a float")
    return float(value)


def _check(reward: Reward, prompt: str, completion: str, value: float) -> float:
    if not math.isfinite(value):
        raise RewardError(f"reward {reward.expression!r} is {value} (not finite) for prompt {_shown(prompt)} and "
                          f"completion {_shown(completion)}; return a finite float (e.g. 0.0 for an answer that "
                          "cannot be judged)")
    return value


def _plugin(name: str) -> Term:
    module_name, _, attr = name.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # as `python -m` does: a module beside the spec's user imports
    # On Kubernetes, task.pluginVolume's files (the operator names their mount), searched first.
    for folder in reversed([d for d in os.environ.get(PLUGINS_ENV, "").split(os.pathsep) if d]):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module itself failing at import
        raise ValueError(
            f"spec.task.reward: {name!r}: module {module_name!r} cannot be imported ({exc.__class__.__name__}: {exc}); "
            "install it, or run from the directory that holds it (or put it on PYTHONPATH); on Kubernetes, "
            "ship its file in task.pluginVolume (e.g. a ConfigMap) or build it into learner.image"
        ) from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(
            f"spec.task.reward: {name!r}: {module_name} has no callable {attr!r}; "
            "define fn(prompt, completion, answer, extra) -> float"
        )
    log.info("reward plug-in %s from %s", name, getattr(module, "__file__", None) or module_name)
    from rlscale.trainer import reward_batched

    if reward_batched.is_batched(fn):
        reward_batched.check_signature(name, fn)
        return Term(1.0, name, fn, batched=True)
    params = inspect.signature(fn).parameters.values()
    takes_finished = any(p.name == "finished" or p.kind == p.VAR_KEYWORD for p in params)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "finished"]
    var_positional = any(p.kind == p.VAR_POSITIONAL for p in params)
    if len(positional) < 3 and not var_positional:
        raise ValueError(
            f"spec.task.reward: {name!r} takes {len(positional)} positional parameters; "
            "define fn(prompt, completion, answer, extra) -> float"
        )
    return Term(1.0, name, fn, takes_extra=len(positional) >= 4 or var_positional, takes_finished=takes_finished)


def resolve_reward(expr: str, *, format_pattern: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                   reward_model: Any = None) -> Reward:
    """The Reward for a `task.reward` expression; plug-ins are imported here (ValueError naming the fix).
    `reward_model`: the spec's task.rewardModel for a reward-model term (None: read from the run config when the
    term is first called; trainer/reward_model.py)."""
    terms = []
    for weight, name in parse_expression(expr):
        if name == REWARD_MODEL_TERM:
            from rlscale.trainer.reward_model import ServedRewardModel

            term = Term(weight, name, None, batch=ServedRewardModel(reward_model))
        elif name == "exact-match":
            term = Term(weight, name, exact_match, safe=True)
        elif name == "math":
            try:
                import math_verify  # noqa: F401
            except ImportError as exc:
                raise ValueError(f"spec.task.reward: {expr!r}: 'math' needs the math-verify package ({exc}); "
                                 "pip install math-verify (the train extra has it)") from None
            term = Term(weight, name, math_equal)
        elif name == "format":
            pattern = format_pattern or DEFAULT_FORMAT_PATTERN  # the spec's own may backtrack for ever
            term = Term(weight, name, format_match(pattern), safe=pattern == DEFAULT_FORMAT_PATTERN)
        else:
            term = _plugin(name)
            term.weight = weight
        terms.append(term)
    return Reward(expr, terms, timeout_s, format_pattern=format_pattern, resolved=True)


def _as_reward(reward: Reward | RewardFn) -> Reward:
    if isinstance(reward, Reward):
        return reward
    name = getattr(reward, "__name__", repr(reward))  # a bare verifier such as exact_match
    return Reward(name, [Term(1.0, name, reward)])


def _raised(reward: Reward, what: str, prompt: str, completion: str) -> RewardError:
    return RewardError(f"reward {reward.expression!r} raised {what} for prompt {_shown(prompt)} and completion "
                       f"{_shown(completion)}; make it return a float for every completion (0.0 when it cannot judge)")


def _timed_out(reward: Reward, prompt: str, completion: str) -> RewardError:
    return RewardError(
        f"reward {reward.expression!r} took more than {reward.timeout_s:g} s (task.rewardTimeout) on prompt "
        f"{_shown(prompt)} and completion {_shown(completion)}; make it faster, raise task.rewardTimeout, or set "
        "task.rewardTimeoutScore to score such calls and go on")


def _in_process(reward: Reward, indices: list[int], rows: list[tuple]) -> list[list[float]]:
    """The known-safe terms, called here: no thread, no process (exact-match on the quickstart's batch)."""
    out = []
    for p, c, a, e, f in rows:
        try:
            out.append([as_float(reward.terms[i], reward.terms[i](p, c, a, e, f), p, c) for i in indices])
        except RewardError:
            raise
        except Exception as exc:
            raise _raised(reward, f"{exc.__class__.__name__}: {exc}", p, c) from exc
    return out


def _threaded(reward: Reward, indices: list[int], rows: list[tuple]) -> list[list[float]]:
    """Without a pool: the rows in one daemon thread, so a call that never returns stops the run with a
    clear error instead of hanging it (the thread itself cannot be killed; the run ends)."""
    out: list[list[float]] = []
    state: dict[str, Any] = {"index": 0, "started": time.monotonic(), "error": None}

    def work() -> None:
        try:
            for i, row in enumerate(rows):
                state["index"], state["started"] = i, time.monotonic()
                out.extend(_in_process(reward, indices, [row]))
        except RewardError as exc:
            state["error"] = exc

    thread = threading.Thread(target=work, name="reward", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(timeout=min(0.5, reward.timeout_s))
        if thread.is_alive() and time.monotonic() - state["started"] > reward.timeout_s:
            raise _timed_out(reward, *rows[state["index"]][:2])
    if state["error"] is not None:
        raise state["error"]
    return out


def _pool_terms(expression: str, format_pattern: str | None, indices: list[int]) -> list[Term]:
    """In a pool's worker: the terms at `indices`, resolved as the driver resolved them (the per-sample pool's, or
    the TRL-style terms' of the batch pool)."""
    return [resolve_reward(expression, format_pattern=format_pattern).terms[i] for i in indices]


def _pool_call(terms: list[Term], row: tuple) -> tuple[str, Any]:
    """In a pool's worker: ("ok", the terms' values), ("bad", why a value is no float) or ("error", what raised)."""
    p, c, a, e, f = row
    try:
        return "ok", [as_float(t, t(p, c, a, e, f), p, c) for t in terms]
    except RewardError as exc:
        return "bad", str(exc)
    except Exception as exc:
        return "error", f"{exc.__class__.__name__}: {exc}"


def _pooled(reward: Reward, rows: list[tuple]) -> list[list[float] | None]:
    """The other terms in the pool's worker processes; None for a call killed at the timeout (scored
    task.rewardTimeoutScore). The first failure in the batch's order stops the run."""
    from rlscale.trainer.reward_pool import BAD, DIED, KILLED, OK, TIMEOUT

    try:
        outcomes = reward.pool.run(rows, stop_on_timeout=reward.timeout_score is None)
    except RuntimeError as exc:  # no worker could start
        raise RewardError(f"reward {reward.expression!r}: {exc}") from None
    for (p, c, *_), o in zip(rows, outcomes, strict=True):
        if o is None or o.kind == OK or (o.kind == TIMEOUT and reward.timeout_score is not None):
            continue
        if o.kind == TIMEOUT:
            raise _timed_out(reward, p, c)
        if o.kind == BAD:
            raise RewardError(o.message)
        if o.kind == KILLED:  # not the reward's doing: the run restarts from its checkpoint, as the learner would
            raise RewardWorkerKilled(f"reward {reward.expression!r}: {o.message}, killed by a signal (the OOM "
                                     f"killer, or a kill) on prompt {_shown(p)} and completion {_shown(c)}")
        if o.kind == DIED:
            raise RewardError(f"reward {reward.expression!r}: {o.message} on prompt {_shown(p)} and completion "
                              f"{_shown(c)}; a reward must return, not end its process")
        raise _raised(reward, o.message, p, c)
    late = [r for r, o in enumerate(outcomes) if o is not None and o.kind == TIMEOUT]
    if late:
        p, c = rows[late[0]][:2]
        log.warning("reward %r: %d calls killed at %g s (task.rewardTimeout), scored %g; the first on prompt %s "
                    "and completion %s", reward.expression, len(late), reward.timeout_s, reward.timeout_score,
                    _shown(p), _shown(c))
    return [o.values if o is not None and o.kind == OK else None for o in outcomes]


def _batched(reward: Reward, term: Term, rows: list[tuple]) -> list[float]:
    """A batch term's values for every row, in one call."""
    if not rows:
        return []
    prompts, completions = [r[0] for r in rows], [r[1] for r in rows]
    got = term.batch(prompts, completions)
    if len(got) != len(rows):
        raise RewardError(f"reward {reward.expression!r}: term {term.name!r} gave {len(got)} values for "
                          f"{len(rows)} completions")
    return [as_float(term, v, p, c) for v, p, c in zip(got, prompts, completions, strict=True)]


def score_terms(reward: Reward | RewardFn, prompts: Sequence[str], completions: Sequence[str],
                answers: Sequence[str], finished: Sequence[bool], extras: Sequence[Mapping] | None = None) -> Scored:
    """The rewards of a batch in order, with each term's values; a failure is a RewardError naming the sample.

    Known-safe terms run here; the others in the reward's pool (Reward.start_pool), each call killed at
    reward.timeout_s, else in a thread whose timeout stops the run. A batch term (reward-model) is called once
    with every pair."""
    reward = _as_reward(reward)
    extras = extras if extras is not None else [{}] * len(prompts)
    rows = list(zip(prompts, completions, answers, extras, finished, strict=True))
    safe = [i for i, t in enumerate(reward.terms) if t.safe and t.batch is None]
    unsafe = [i for i, t in enumerate(reward.terms) if not t.safe and t.batch is None and not t.batched]
    values: list[list[float | None]] = [[None] * len(reward.terms) for _ in rows]
    for i in [i for i, t in enumerate(reward.terms) if t.batch is not None]:
        for r, v in enumerate(_batched(reward, reward.terms[i], rows)):
            values[r][i] = v
    abstained = _score_trl(reward, rows, values)
    for r, vals in enumerate(_in_process(reward, safe, rows) if safe else []):
        for i, v in zip(safe, vals, strict=True):
            values[r][i] = v
    if unsafe:
        got = _pooled(reward, rows) if reward.pool is not None else _threaded(reward, unsafe, rows)
        for r, vals in enumerate(got):
            for i, v in zip(unsafe, vals or [None] * len(unsafe), strict=True):
                values[r][i] = v
    rewards, timeouts = [], 0
    for (p, c, *_), vals in zip(rows, values, strict=True):
        if any(v is None for v in vals):  # killed at the timeout
            rewards.append(float(reward.timeout_score))
            timeouts += 1
        else:
            rewards.append(_check(reward, p, c, sum(t.weight * v for t, v in zip(reward.terms, vals, strict=True))))
    terms: dict[str, list[float]] = {}
    for i, t in enumerate(reward.terms):
        terms.setdefault(t.name, [v[i] for r, v in enumerate(values) if v[i] is not None and (r, i) not in abstained])
    reward.timeouts += timeouts
    return Scored(rewards, terms, timeouts)


def _score_trl(reward: Reward, rows: list[tuple], values: list[list[float | None]]) -> set[tuple[int, int]]:
    """The TRL-style terms' values, in one call a batch, into `values`; the (row, term) pairs where the function
    returned None (it does not apply: 0 in the sum, out of the term's mean)."""
    indices = [i for i, t in enumerate(reward.terms) if t.batched]
    if not indices or not rows:
        return set()
    from rlscale.trainer import reward_batched

    got = (reward_batched.pooled(reward, rows) if reward.batch_pool is not None
           else reward_batched.in_thread(reward, indices, rows))
    abstained = set()
    for r in range(len(rows)):
        for k, i in enumerate(indices):
            v = got[r][k] if got is not None else None  # None from pooled: killed at the timeout
            if got is not None and v is None:
                abstained.add((r, i))
                v = 0.0
            values[r][i] = v
    return abstained


def score(reward: Reward | RewardFn, prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str],
          finished: Sequence[bool], extras: Sequence[Mapping] | None = None) -> list[float]:
    """Rewards of a batch, each within reward.timeout_s; any failure is a RewardError naming the sample."""
    return score_terms(reward, prompts, completions, answers, finished, extras).rewards
