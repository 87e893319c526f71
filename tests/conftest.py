"""Shared test helpers: paths and small spec builders."""

from __future__ import annotations

import contextlib
import copy
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.lanes import LANES, LanePlugin

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 30.0, interval: float = 0.25) -> Any:
    """Poll fn until it returns something truthy; fail naming what never happened."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def rlrun_dict(spec: dict | None = None, name: str = "t") -> dict:
    """A minimal RLRun object around a spec mapping."""
    return {"apiVersion": "rlscale.dev/v1alpha1", "kind": "RLRun", "metadata": {"name": name},
            "spec": copy.deepcopy(spec or {})}


def rlscale_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`rlscale ARGS` in this process (a new interpreter per call costs 1.3 s to 6 s of imports):
    exit code, stdout and stderr as a user sees them. An exception escaping the command would
    reach the user as a traceback, so it fails the test."""
    from typer.testing import CliRunner

    from rlscale.cli import app

    with contextlib.chdir(cwd):
        result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        pytest.fail("rlscale " + " ".join(args) + " raised:\n" + "".join(traceback.format_exception(result.exception)))
    return subprocess.CompletedProcess(["rlscale", *args], result.exit_code, result.stdout, result.stderr)


@pytest.fixture
def root() -> Path:
    return ROOT


def pytest_addoption(parser):
    parser.addoption("--lane", choices=LANES, default=None,
                     help="run only this lane's tests (tests/lanes.py; `make test` runs both side by side)")


def pytest_configure(config):
    # A plugin of its own, not hooks here: this file's other collection hooks stay free for other uses.
    if config.getoption("--lane"):
        config.pluginmanager.register(LanePlugin(config.getoption("--lane"), ROOT), "rlscale-lane")


@pytest.fixture(autouse=True)
def _autograd_back_on():
    """One pytest process runs rollout and learner tests: a test that turns autograd off globally
    (vLLM, inference helpers) must not leave the learner tests without gradients."""
    yield
    torch = sys.modules.get("torch")
    if torch is not None and not torch.is_grad_enabled():
        torch.set_grad_enabled(True)


def http_get(port: int, path: str) -> tuple[int, str]:
    """GET http://127.0.0.1:port/path as (status, body), an error status included."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def pytest_ignore_collect(collection_path, config):
    """Under -m, a file none of whose tests the expression can select is not imported (tests/unit_collect.py)."""
    from tests.unit_collect import ignore_file

    return True if ignore_file(collection_path, config.option.markexpr) else None
