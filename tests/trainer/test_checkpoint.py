"""Kill a learner mid-run and resume: the next batch and the weights after it match an uninterrupted run."""

from __future__ import annotations

import json

import pytest

from rlscale.trainer import checkpoint
from rlscale.trainer.lr_schedule import lr_factor

pytestmark = pytest.mark.slow


def read_run(path):
    return {r["step"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_kill_and_resume_continues_with_the_same_next_batch(small_model, tmp_path, run_ranks):
    # A linear decay to 0 at 4 trained steps: the resumed step must train at the schedule's position. A reward
    # that tells samples apart ("signal") makes the steps train (exact-match on this model skips them all).
    config = {"model_path": str(small_model), "zero_stage": 1, "micro_batch": 16, "lr": 1e-3,
              "lr_schedule": "linear", "decay_steps": 4}
    common = {"config": config, "prompts": 4, "samples_per_prompt": 4, "every": 2, "steps": 3, "out": str(tmp_path),
              "signal": True}

    # Checkpoint at step 2, one more step (recorded: what an uninterrupted run does at step 3),
    # then SIGKILL while writing the next checkpoint.
    killed = run_ranks("loop", {**common, "ckpt": str(tmp_path / "ckpt-b"), "tag": "b", "crash_after": 3},
                       tmp_path, expect_kill=True)
    assert killed[0].returncode == -9
    latest = checkpoint.latest_checkpoint(tmp_path / "ckpt-b")
    assert latest is not None and latest.name == "step-00000002"
    assert (tmp_path / "ckpt-b" / ".tmp-step-00000004").exists()  # the half-written one is ignored

    run_ranks("loop", {**common, "ckpt": str(tmp_path / "ckpt-b"), "tag": "resumed"}, tmp_path)
    a = read_run(tmp_path / "run-b.jsonl")
    resumed = read_run(tmp_path / "run-resumed.jsonl")
    assert sorted(a) == [1, 2, 3]
    assert sorted(resumed) == [3], "the resumed run must start after the checkpointed step 2"
    # Same prompts, same sampled responses (they depend on the restored weights), same update.
    assert resumed[3]["prompts"] == a[3]["prompts"]
    assert resumed[3]["responses"] == a[3]["responses"]
    assert resumed[3]["param_sum"] == pytest.approx(a[3]["param_sum"], rel=1e-9, abs=1e-9)
    # The schedule's position (the learner's trained steps) came back with the checkpoint, and each step trained
    # at the lr the schedule gives there: step 3 is 2 trained steps in, at (4 - 2) / 4 of the peak.
    assert not any(r["skipped"] for r in (*a.values(), resumed[3]))
    assert [a[s]["trained_before"] for s in (1, 2, 3)] == [0, 1, 2] and resumed[3]["trained_before"] == 2
    assert [a[s]["lr"] for s in (1, 2, 3)] == pytest.approx([1e-3 * lr_factor(s, "linear", 0, 4) for s in (0, 1, 2)])
    assert resumed[3]["lr"] == pytest.approx(a[3]["lr"], rel=1e-9) and a[3]["lr"] < a[1]["lr"]
    # And the steps before differ from step 3: the test compares something that moves.
    assert a[2]["prompts"] != a[3]["prompts"]
