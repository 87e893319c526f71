"""A long real-node scenario, run once by a fixture and checked by many tests: the fixture runs
the scenario's steps in order and records how each ended (done, or the exception that stopped
it), and each test checks one property, failing with the recorded error of a step it needs, so
one failed step does not hide the properties the other steps show. Each step's start and seconds are
recorded too (`Steps.timeline()`): where a scenario's minutes go."""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pytest


class StepNotRun(Exception):
    """A step left out because a step it needs did not complete; `cause` names the step that
    failed (None when none did: a step it needs was never run)."""

    def __init__(self, message: str, cause: tuple[str, Exception] | None):
        super().__init__(message)
        self.cause = cause


@dataclass
class Steps:
    """How each step of a scenario ended: its name in `done`, or its exception in `errors`; and when
    each step that ran started (`started`, seconds after the first one did) and how long it took
    (`seconds`)."""

    done: list[str] = field(default_factory=list)
    errors: dict[str, Exception] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    _t0: float | None = None

    def run(self, name: str, step: Callable[[], object], needs: Iterable[str] = ()) -> bool:
        """Run `step` unless one of the steps it `needs` did not complete; record how it ended.
        Only an Exception is recorded: pytest's own outcomes (its timeout, an interrupt) go on up."""
        missing = [n for n in needs if n not in self.done]
        if missing:
            self.errors[name] = self._not_run(missing[0])
            return False
        t = self.clock()
        if self._t0 is None:
            self._t0 = t
        self.started[name] = round(t - self._t0, 1)
        try:
            step()
        except Exception as exc:
            self.errors[name] = exc
            print(f"\nscenario step {name!r} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return False
        finally:
            self.seconds[name] = round(self.clock() - t, 1)
        self.done.append(name)
        return True

    def timeline(self) -> str:
        """One line per step that ran, in order: its start (seconds into the scenario), its seconds,
        and how it ended; then the total."""
        rows = [f"{self.started[n]:8.1f} {self.seconds[n]:8.1f}  {'done' if n in self.done else 'FAILED'}  {n}"
                for n in sorted(self.seconds, key=self.started.__getitem__)]
        total = max((self.started[n] + self.seconds[n] for n in self.seconds), default=0.0)
        return "\n".join(["   start  seconds  step", *rows, f"{total:8.1f}           the whole scenario"])

    def _not_run(self, needed: str) -> StepNotRun:
        exc = self.errors.get(needed)
        cause = exc.cause if isinstance(exc, StepNotRun) else (needed, exc) if exc else None
        if cause is None:
            return StepNotRun(f"not run: it needs {needed!r}, which did not run", None)
        failed, err = cause
        why = "which failed" if failed == needed else f"which did not run as {failed!r} failed"
        return StepNotRun(f"not run: it needs {needed!r}, {why}: {type(err).__name__}: {err}", cause)

    def require(self, *names: str) -> None:
        """Fail the calling test with the recorded error of the first of `names` that did not
        complete (with the traceback where the step raised it)."""
        for name in names:
            if name in self.done:
                continue
            exc = self.errors.get(name)
            if exc is None:
                pytest.fail(f"scenario step {name!r} did not run", pytrace=False)
            if isinstance(exc, StepNotRun):
                pytest.fail(f"scenario step {name!r} {exc}", pytrace=False)
            pytest.fail(f"scenario step {name!r} failed: {type(exc).__name__}: {exc}\n\nraised at:\n"
                        + "".join(traceback.format_exception(exc)), pytrace=False)
