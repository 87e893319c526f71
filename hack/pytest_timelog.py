"""A pytest plugin that appends each test's wall seconds (setup, call and teardown) to a JSON-lines file as
the test ends, so a long suite shows where its time goes while it runs, and a run cut short keeps what it
measured:  PYTHONPATH=hack TIMELOG=/tmp/times.jsonl .venv/bin/python -m pytest -p pytest_timelog ..."""

from __future__ import annotations

import json
import os
import time

_started: dict[str, float] = {}


def pytest_runtest_logstart(nodeid, location):
    _started[nodeid] = time.time()


def pytest_runtest_logfinish(nodeid, location):
    t0 = _started.pop(nodeid, None)
    if t0 is None:
        return
    now = time.time()
    with open(os.environ.get("TIMELOG", "timelog.jsonl"), "a") as f:
        f.write(json.dumps({"id": nodeid, "s": round(now - t0, 2), "end": round(now, 1)}) + "\n")
