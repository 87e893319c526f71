"""The checkpoint directory's crash safety, file by file (no DeepSpeed: the engines' shards
are stand-in files; what is tested is what finish() and latest_checkpoint() do with them)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from rlscale.trainer import checkpoint as ck


def save(base, step, keep=2, run_id="team-a/run", payload="w"):
    """What a learner's save does: shards into .tmp-step-N, then finish()."""
    name = f"step-{step:08d}"
    tmp = base / f".tmp-{name}"
    shutil.rmtree(tmp, ignore_errors=True)  # as the learner does before its engines write
    (tmp / "policy").mkdir(parents=True)
    (tmp / "policy" / "shard.pt").write_text(f"{payload}{step}")
    return ck.finish(tmp, base / name, {"run": {"step": step, "run_id": run_id}}, keep)


def test_latest_names_the_newest_and_old_ones_are_pruned(tmp_path):
    for s in (10, 20, 30):
        save(tmp_path, s)
    assert ck.latest_checkpoint(tmp_path).name == "step-00000030"
    assert [p.name for p in ck.complete_steps(tmp_path)] == ["step-00000020", "step-00000030"]


def test_a_crash_mid_write_leaves_the_last_complete_one_and_the_next_save_cleans_up(tmp_path):
    save(tmp_path, 10)
    half = tmp_path / ".tmp-step-00000020" / "policy"
    half.mkdir(parents=True)
    (half / "shard.pt").write_text("partial")
    assert ck.latest_checkpoint(tmp_path).name == "step-00000010"
    save(tmp_path, 20)
    assert not list(tmp_path.glob(".tmp-*"))
    assert ck.latest_checkpoint(tmp_path).name == "step-00000020"


def test_latest_missing_or_stale_falls_back_to_the_newest_complete_step(tmp_path):
    save(tmp_path, 10)
    save(tmp_path, 20)
    (tmp_path / ck.LATEST).unlink()
    assert ck.latest_checkpoint(tmp_path).name == "step-00000020"
    # A crash between the rename and writing `latest`: it still names step 10.
    (tmp_path / ck.LATEST).write_text("step-00000010\n")
    assert ck.latest_checkpoint(tmp_path).name == "step-00000020"
    # `latest` naming a directory without its run state (deleted by hand, half copied).
    (tmp_path / ck.LATEST).write_text("step-00000099\n")
    assert ck.latest_checkpoint(tmp_path).name == "step-00000020"
    # A step directory without run_state.json is not complete.
    (tmp_path / "step-00000030" / "policy").mkdir(parents=True)
    assert ck.latest_checkpoint(tmp_path).name == "step-00000020"


def test_saving_a_step_again_never_leaves_latest_pointing_at_nothing(tmp_path, monkeypatch):
    save(tmp_path, 10, payload="old")
    # Crash right after the old copy was moved aside, before the new one takes its name.
    real_rename = os.rename
    calls = []

    def crash_on_second(src, dst):
        calls.append((src, dst))
        real_rename(src, dst)
        if len(calls) == 1:
            raise KeyboardInterrupt("killed")

    monkeypatch.setattr(ck.os, "rename", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 10, payload="new")
    monkeypatch.setattr(ck.os, "rename", real_rename)
    # The old copy is aside, the new one still in .tmp: nothing complete is named step-10 ...
    assert (tmp_path / ".old-step-00000010" / ck.STATE_FILE).exists()
    # ... and the save after it restores order: one step-10 (the new one), no leftovers.
    save(tmp_path, 10, payload="new")
    assert (tmp_path / "step-00000010" / "policy" / "shard.pt").read_text() == "new10"
    assert not list(tmp_path.glob(".old-*")) and not list(tmp_path.glob(".tmp-*"))
    assert ck.latest_checkpoint(tmp_path).name == "step-00000010"


def test_the_marker_comes_last_so_a_rename_file_by_file_never_shows_a_half_step(tmp_path, monkeypatch):
    save(tmp_path, 10)
    real_rename = os.rename

    def copying(src, dst):
        # A FUSE-mounted object store renames a directory by copying its files one by one (here the
        # marker's name first, were it there); killed after the first file.
        if os.path.basename(src).startswith(".tmp-"):
            first = sorted((p for p in src.rglob("*") if p.is_file()), key=lambda p: p.name != ck.STATE_FILE)[0]
            (dst / first.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(first, dst / first.relative_to(src))
            raise KeyboardInterrupt("killed mid-rename")
        real_rename(src, dst)

    monkeypatch.setattr(ck.os, "rename", copying)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 20)
    monkeypatch.setattr(ck.os, "rename", real_rename)
    assert (tmp_path / "step-00000020").is_dir() and not (tmp_path / "step-00000020" / ck.STATE_FILE).exists()
    assert [p.name for p in ck.complete_steps(tmp_path)] == ["step-00000010"]
    assert ck.latest_checkpoint(tmp_path).name == "step-00000010"
    # Saved again, step 20 is whole.
    save(tmp_path, 20)
    assert ck.read_state(tmp_path / "step-00000020")["run"]["step"] == 20


def test_a_run_never_resumes_from_another_runs_checkpoints(tmp_path):
    path = save(tmp_path, 10, run_id="team-a/alpha")
    ck.check_identity(path, "team-a/alpha")
    with pytest.raises(ck.CheckpointError) as e:
        ck.check_identity(path, "team-b/beta")
    assert all(s in str(e.value) for s in ("spec.checkpoint.path", "team-a/alpha", "a path of its own"))
    # Checkpoints from before run identities existed are accepted.
    old = tmp_path / "step-00000010" / ck.STATE_FILE
    old.write_text(json.dumps({"run": {"step": 10}}))
    ck.check_identity(path, "team-b/beta")


def test_the_newest_common_step_is_the_newest_every_rank_holds():
    assert ck.newest_common_step([[2, 4], [2]]) == (2, [4])
    assert ck.newest_common_step([[2, 4], [2, 4]]) == (4, [])
    assert ck.newest_common_step([[4], [2]]) == (None, [4, 2])
    assert ck.newest_common_step([[], []]) == (None, [])
