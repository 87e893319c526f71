"""No time-to-target headline rests on a placeholder samples-to-target (rlscale/plan/headline.py): `rlscale
plan` shows the step time, the throughput and "unknown until calibrated" for a spec nobody measured."""

from __future__ import annotations

import re

import pytest
import yaml
from typer.testing import CliRunner

from rlscale.cli import app
from rlscale.plan import Plan, make_plan
from rlscale.plan.headline import (
    UNKNOWN,
    known_samples_to_target,
    known_time_to_target,
    relative,
    time_to_target_text,
)
from rlscale.spec import parse_spec

# A bring-your-own spec: the builtin task at a difficulty nobody measured, so its samples-to-target is the
# placeholder.
BYO = {"model": {"path": "builtin:tiny-arith", "dtype": "float32", "maxLength": 32},
       "task": {"name": "builtin:arithmetic", "reward": "exact-match", "difficulty": 2, "maxNewTokens": 4},
       "hardware": {"accelerator": "cpu"}}
DURATION = re.compile(r"\d+(\.\d+)?s\b|\d+m\d\ds|\d+h\d\dm")


def _plan_dict(known: bool) -> dict:
    return {"samplesToTargetKnown": known, "predicted": {"samplesToTarget": 40_000.0, "timeToTargetSeconds": 125.0,
                                                         "stepSeconds": 0.7, "samplesPerSecond": 365.0}}


def test_only_a_measured_samples_to_target_gives_a_time():
    assert known_time_to_target(_plan_dict(True)) == 125.0 and known_samples_to_target(_plan_dict(True)) == 40_000
    assert time_to_target_text(_plan_dict(True)) == "2m05s"
    guess = _plan_dict(False)
    assert known_time_to_target(guess) is None and known_samples_to_target(guess) is None
    text = time_to_target_text(guess)
    assert text.startswith(UNKNOWN) and "target.expectedSamples" in text and not DURATION.search(text)
    assert known_time_to_target({}) is None and known_time_to_target(None) is None  # no plan, an old plan
    assert relative(110.0, 100.0) == "x1.10" and relative(1.0, 0.0) == "-"


def test_a_plan_knows_where_its_samples_to_target_came_from():
    assert not make_plan(parse_spec(BYO)).samples_to_target_known
    given = make_plan(parse_spec({**BYO, "target": {"expectedSamples": 50_000}}))
    assert given.samples_to_target_known
    assert given.to_dict()["samplesToTargetKnown"] is True
    assert Plan.from_dict(given.to_dict()).samples_to_target_known
    old = {k: v for k, v in given.to_dict().items() if k != "samplesToTargetKnown"}
    assert not Plan.from_dict(old).samples_to_target_known  # written before the key: not shown as known


def _plan_output(tmp_path, spec: dict) -> str:
    f = tmp_path / "run.yaml"
    f.write_text(yaml.safe_dump({"apiVersion": "rlscale.dev/v1alpha1", "kind": "RLRun", "metadata": {"name": "r"},
                                 "spec": spec}))
    r = CliRunner().invoke(app, ["plan", str(f)], env={"COLUMNS": "240"})
    assert r.exit_code == 0, r.output
    return r.output


def _row(output: str, label: str) -> str:
    return next(line for line in output.splitlines() if label in line)


@pytest.mark.parametrize("known", [False, True])
def test_plan_command_shows_a_time_only_when_measured(tmp_path, known):
    spec = {**BYO, "target": {"expectedSamples": 50_000}} if known else BYO
    out = _plan_output(tmp_path, spec)
    assert DURATION.search(_row(out, "step time")) and "samples/s" in _row(out, "throughput")
    row = _row(out, "time to target")
    if known:
        assert DURATION.search(row) and UNKNOWN not in row
    else:
        assert UNKNOWN in row and not DURATION.search(row.split("time to target")[1])
        # the candidates' E and T as ratios to the chosen plan's, never as counts or times
        assert "E and T relative to the chosen plan's" in out
        rows = [line for line in out.splitlines() if re.search(r"x\d\.\d\d\W+x\d\.\d\d", line)]
        assert len(rows) > 1 and "x1.00" in rows[0] and rows[0].count("x1.00") == 2  # the chosen plan first
        assert not any(re.search(r"\d+k\b", line) for line in rows)
