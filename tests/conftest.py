"""Shared test helpers: paths and small spec builders."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def rlrun_dict(spec: dict | None = None, name: str = "t") -> dict:
    """A minimal RLRun object around a spec mapping."""
    return {"apiVersion": "rlscale.dev/v1alpha1", "kind": "RLRun", "metadata": {"name": name}, "spec": copy.deepcopy(spec or {})}


@pytest.fixture
def root() -> Path:
    return ROOT
