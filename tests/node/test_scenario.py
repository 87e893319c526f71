"""tests/node/scenario.py's record of a scenario: how each step ended, and when it ran (pure: a fake clock)."""

from __future__ import annotations

import pytest

from tests.node.scenario import StepNotRun, Steps


class Clock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_each_step_records_its_start_and_seconds_failed_or_not():
    clock = Clock()
    s = Steps(clock=clock)

    def takes(seconds, fail=False):
        def step():
            clock.t += seconds
            if fail:
                raise RuntimeError("boom")
        return step
    assert s.run("a", takes(12.0))
    clock.t += 3.0  # between steps (the fixture's own work) counts in no step
    assert not s.run("b", takes(40.0, fail=True))
    assert not s.run("c", takes(5.0), needs=["b"])  # not run: no time recorded
    assert s.run("d", takes(7.5))
    assert s.started == {"a": 0.0, "b": 15.0, "d": 55.0}
    assert s.seconds == {"a": 12.0, "b": 40.0, "d": 7.5}
    assert isinstance(s.errors["c"], StepNotRun) and s.errors["c"].cause[0] == "b"
    lines = s.timeline().splitlines()
    assert [ln.split()[-1] for ln in lines[1:-1]] == ["a", "b", "d"]
    assert "FAILED" in lines[2] and "done" in lines[3]
    assert lines[-1].split()[0] == "62.5"  # from the first step's start to the last one's end


def test_require_fails_with_the_error_of_the_step_a_test_needs():
    s = Steps()
    s.run("a", lambda: 1 / 0)
    s.run("b", lambda: None, needs=["a"])
    with pytest.raises(pytest.fail.Exception, match="ZeroDivisionError"):
        s.require("b")
