"""make test's lanes (tests/lanes.py, hack/test-lanes.sh): every test in exactly one lane, and the
lane of each folder the module's docstring gives it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.lanes import LANES, lane_of


@pytest.mark.parametrize(("nodeid", "lane"), [
    ("tests/operator/test_cluster.py::test_x", "k8s"),
    ("tests/operator/test_builders.py::TestA::test_b[1]", "k8s"),
    ("tests/node/test_real_node.py::test_x", "k8s"),
    ("tests/images/test_push.py::test_x", "k8s"),
    ("tests/e2e/test_sweep.py::test_x", "local"),
    ("tests/rollout/test_scaling.py::test_x", "local"),
    ("tests/trainer/test_gang.py::test_x", "local"),
    ("tests/core/test_cli.py::test_x", "local"),
    ("tests/test_lanes.py::test_x", "local"),
    # a folder whose name only starts like a k8s one is not in it
    ("tests/operators_extra/test_x.py::test_x", "local"),
    ("tests\\node\\test_real_node.py::test_x", "k8s"),
])
def test_each_folder_has_its_lane(nodeid, lane):
    assert lane_of(nodeid) == lane


def collected(*args: str) -> set[str]:
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 5), r.stdout[-3000:] + r.stderr[-3000:]
    return {ln for ln in r.stdout.splitlines() if "::" in ln}


def test_the_lanes_split_a_selection_without_loss_or_overlap():
    """Collected for real through the conftest hooks: the two lanes together are the selection, apart. Folders
    (their files skipped unimported by the other lane) and a file named on the command line (deselected)."""
    args = ("tests/plan", "tests/images", "tests/test_lanes.py", "tests/operator/test_status.py")
    whole = collected(*args)
    lanes = {lane: collected("--lane", lane, *args) for lane in LANES}
    assert lanes["k8s"] and lanes["local"], lanes
    assert not lanes["k8s"] & lanes["local"]
    assert lanes["k8s"] | lanes["local"] == whole
    assert all(lane_of(t) == lane for lane, ts in lanes.items() for t in ts)


def test_an_unknown_lane_is_refused_naming_the_choices():
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "--lane", "gpu", "tests/test_lanes.py"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 4
    assert "--lane" in r.stderr and "'gpu'" in r.stderr and "k8s" in r.stderr and "local" in r.stderr, r.stderr


def test_a_profile_sums_per_lane_and_file(tmp_path, capsys):
    from tests.lanes import lane_seconds, main

    rows = [{"id": "tests/node/test_a.py::t1", "s": 60.0}, {"id": "tests/node/test_a.py::t2", "s": 30.0},
            {"id": "tests/e2e/test_b.py::t", "s": 120.0}, {"id": "tests/operator/test_c.py::t[x]", "s": 6.0}]
    got = lane_seconds(rows)
    assert got == {"k8s": {"tests/node/test_a.py": 90.0, "tests/operator/test_c.py": 6.0},
                   "local": {"tests/e2e/test_b.py": 120.0}}
    p = tmp_path / "t.jsonl"
    p.write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    assert main([str(p)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "k8s: 1.6 min in 2 files" and out[1].split() == ["1.5", "min", "tests/node/test_a.py"]
    assert "local: 2.0 min in 1 files" in out
