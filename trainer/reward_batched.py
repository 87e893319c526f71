"""TRL-style batched reward plug-ins: `fn(prompts, completions, **kwargs) -> list[float]`, called once per batch.

TRL's `GRPOTrainer(reward_funcs=...)` calls each function with keywords only: `prompts` and `completions` (lists,
one item a sample) and, as further keyword lists of the same length, the dataset's other columns. A plug-in in
`task.reward` whose signature names a `completions` parameter is taken to follow that convention and is called the
same way, unchanged:

- `prompts`: the texts the model was given (after `task.systemPrompt` and the chat template), as strings: TRL's
  "standard" format. A function written for TRL's conversational format (`completion[0]["content"]`) sees strings.
- `completions`: the decoded responses, without special tokens.
- one keyword a column: `task.extraFields`' columns (unset: every column of the row but the prompt's and
  `prompt`/`completion`), a list with one value a sample (None where a row lacks the column).
- TRL's `completion_ids` and `trainer_state` are not passed; a function that names them as parameters of its own
  (rather than reading **kwargs) is refused when it is resolved, naming the parameter.

It returns one value a completion: a float, or None where the function does not apply (TRL's convention for
multi-task rewards), which adds 0 to the weighted sum, as TRL's nansum does, and is left out of the term's logged
mean. A function without **kwargs is passed only the columns it names.

In a run the call goes to a worker process of its own (trainer/reward_pool.py, started with the per-sample pool),
killed after task.rewardTimeout for each completion of the batch (a batch of 64 gets 64 x the timeout, what 64
per-sample calls in a row would get); a call killed there scores every completion of the batch
task.rewardTimeoutScore, or stops the run when that is unset.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlscale.trainer.reward_errors import RewardError

# TRL passes these too; rlscale has no equivalent at reward time.
UNSUPPORTED = ("completion_ids", "trainer_state")
# Columns TRL keeps out of the keyword arguments (they are the prompts and completions themselves).
NOT_COLUMNS = ("prompt", "completion")


def is_batched(fn: Callable[..., Any]) -> bool:
    """A TRL-style function: its signature names a `completions` parameter (TRL calls by keyword)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: a per-sample function as before
        return False
    return "completions" in params


def check_signature(name: str, fn: Callable[..., Any]) -> tuple[bool, frozenset[str]]:
    """(takes **kwargs, the keyword names it declares); ValueError naming what rlscale cannot pass."""
    params = inspect.signature(fn).parameters
    for p in params.values():
        if p.name in UNSUPPORTED and p.default is p.empty:
            raise ValueError(
                f"spec.task.reward: {name!r} needs the parameter {p.name!r}, which TRL passes and rlscale does not "
                "(no token ids or trainer state at reward time); give it a default or read it from **kwargs")
        if p.kind == p.POSITIONAL_ONLY:
            raise ValueError(
                f"spec.task.reward: {name!r}: parameter {p.name!r} is positional-only, but a TRL-style reward "
                "(one with a 'completions' parameter) is called with keywords only, as TRL calls it; drop the '/'")
    var_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
    return var_kw, frozenset(p.name for p in params.values() if p.kind != p.VAR_KEYWORD)


def columns(extras: Sequence[Mapping], accepts_all: bool, named: frozenset[str]) -> dict[str, list]:
    """The dataset's other columns as TRL passes them: {column: [value a sample]}."""
    keys: dict[str, None] = {}
    for e in extras:
        keys.update(dict.fromkeys(e))
    return {k: [e.get(k) for e in extras] for k in keys
            if k not in NOT_COLUMNS and k not in ("prompts", "completions") and (accepts_all or k in named)}


def call(term: Any, rows: Sequence[tuple]) -> list[float | None]:
    """One call of a TRL-style term on rows (prompt, completion, answer, extra, finished): a value a row, None
    where the function returned None. RewardError when it returns something else than a list of that length
    of numbers or None."""
    accepts_all, named = check_signature(term.name, term.fn)
    prompts, completions = [r[0] for r in rows], [r[1] for r in rows]
    kwargs = columns([r[3] for r in rows], accepts_all, named)
    kw: dict[str, Any] = {"completions": completions, **kwargs}
    if accepts_all or "prompts" in named:
        kw["prompts"] = prompts
    got = term.fn(**kw)
    try:
        got = list(got)
    except TypeError:
        raise RewardError(f"reward {term.name!r} returned {type(got).__name__} for a batch of {len(rows)}; a TRL-style "
                          "reward (one with a 'completions' parameter) returns a list of floats, one a completion"
                          ) from None
    if len(got) != len(rows):
        raise RewardError(f"reward {term.name!r} returned {len(got)} values for a batch of {len(rows)} completions; "
                          "return one value a completion, in their order")
    out: list[float | None] = []
    for v, p, c in zip(got, prompts, completions, strict=True):
        if v is None:
            out.append(None)
        elif isinstance(v, (int, float)) or hasattr(v, "__float__"):
            out.append(float(v))
        else:
            raise RewardError(f"reward {term.name!r} returned {v!r} ({type(v).__name__}) for prompt {p[:160]!r} and "
                              f"completion {c[:160]!r}; return a float (or None where it does not apply)")
    return out


def pool_call(terms: list[Any], rows: Sequence[tuple]) -> tuple[str, Any]:
    """In a worker: ("ok", [the terms' values a row]), ("bad", why) or ("error", what raised)."""
    try:
        per_term = [call(t, rows) for t in terms]
    except RewardError as exc:
        return "bad", str(exc)
    except Exception as exc:
        return "error", f"{exc.__class__.__name__}: {exc}"
    return "ok", [list(vals) for vals in zip(*per_term, strict=True)] if per_term else []


def in_thread(reward: Any, indices: list[int], rows: list[tuple]) -> list[list[float | None]]:
    """Without a pool: the calls in a daemon thread, so one that never returns stops the run with a clear error."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["ok"] = pool_call([reward.terms[i] for i in indices], rows)
        except BaseException as exc:  # noqa: BLE001 - told to the caller
            box["ok"] = ("error", f"{exc.__class__.__name__}: {exc}")

    thread = threading.Thread(target=work, name="reward-batch", daemon=True)
    limit = reward.timeout_s * max(1, len(rows))
    thread.start()
    thread.join(timeout=limit)
    if thread.is_alive():
        raise _timed_out(reward, len(rows), limit)
    return _outcome(reward, *box["ok"], len(rows))


def pooled(reward: Any, rows: list[tuple]) -> list[list[float | None]] | None:
    """The calls in the batched pool's worker; None when the call was killed at its timeout and
    task.rewardTimeoutScore is set (every row scores it)."""
    from rlscale.trainer.reward_pool import DIED, KILLED, OK, TIMEOUT

    pool = reward.batch_pool
    pool.timeout_s = reward.timeout_s * max(1, len(rows))  # the batch's own budget, set before each call
    try:
        (o,) = pool.run([rows], stop_on_timeout=reward.timeout_score is None)
    except RuntimeError as exc:  # no worker could start
        raise RewardError(f"reward {reward.expression!r}: {exc}") from None
    if o.kind == TIMEOUT:
        if reward.timeout_score is None:
            raise _timed_out(reward, len(rows), pool.timeout_s)
        return None
    if o.kind == KILLED:
        from rlscale.trainer.reward_errors import RewardWorkerKilled

        raise RewardWorkerKilled(f"reward {reward.expression!r}: {o.message}, killed by a signal (the OOM killer, "
                                 f"or a kill) on a batch of {len(rows)}")
    if o.kind == DIED:
        raise RewardError(f"reward {reward.expression!r}: {o.message} on a batch of {len(rows)}; a reward must "
                          "return, not end its process")
    return _outcome(reward, o.kind, o.values if o.kind == OK else o.message, len(rows))


def _outcome(reward: Any, kind: str, payload: Any, n: int) -> list[list[float | None]]:
    if kind == "ok":
        return payload
    if kind == "bad":
        raise RewardError(payload)
    raise RewardError(f"reward {reward.expression!r} raised {payload} on a batch of {n} completions; make it return "
                      "a value for every completion (None where it does not apply)")


def _timed_out(reward: Any, n: int, limit: float) -> RewardError:
    return RewardError(
        f"reward {reward.expression!r} took more than {limit:g} s on a batch of {n} completions "
        f"(task.rewardTimeout {reward.timeout_s:g} s a completion); make it faster, raise task.rewardTimeout, or set "
        "task.rewardTimeoutScore to score such batches and go on")
