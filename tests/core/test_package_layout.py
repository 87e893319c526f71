"""Folders map to import packages (operator/ is rlscale.operator): the mapping must not hide the stdlib."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

CHECK = ("import operator, os, sys, sysconfig; "
         "assert os.path.dirname(operator.__file__) == sysconfig.get_path('stdlib'), operator.__file__; "
         "import rlscale.operator, rlscale.trainer, rlscale.rollout; "
         "print(rlscale.operator.__file__)")


@pytest.mark.parametrize("how", [["-c", CHECK], ["-I", "-c", CHECK]])
def test_python_started_in_the_checkout_finds_the_stdlib_operator(how):
    # The repository root is sys.path[0] here. Python imports the stdlib `operator` while it
    # starts (site), before that entry exists, so the folder never shadows it.
    r = subprocess.run([sys.executable, *how], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("operator/__init__.py")


def test_python_with_the_checkout_on_pythonpath_stops_at_once_naming_the_folder_and_the_fix():
    # PYTHONPATH puts the root on sys.path before site runs, so the folder would be found first as
    # `operator` and every stdlib module that needs it would break somewhere far from the cause.
    import os

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", "import collections"], cwd="/", env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    assert "the rlscale checkout is on PYTHONPATH" in r.stderr and "take the checkout off PYTHONPATH" in r.stderr, \
        r.stderr[-2000:]
