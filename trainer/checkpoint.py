"""Crash-safe checkpoints: the DeepSpeed engines' state plus the run state, one directory per step.

Layout: DIR/step-00000050/{policy/, critic/, run_state.json} and DIR/latest naming the
newest complete one. A checkpoint is written to DIR/.tmp-step-N, flushed to disk (every
file and directory fsynced), and renamed only when every rank has finished; its completion
marker, run_state.json, is written into it last, after the rename, so a crash at any point
leaves the last complete one in place, also where a directory rename is not atomic (a
FUSE-mounted object store renames file by file):

- `latest` is a hint: when it is missing or names an incomplete directory, the newest
  complete `step-*` (one with its run_state.json) is used;
- re-saving a step that exists moves the old one aside first and deletes it only after the
  new one is in place and `latest` points at it;
- leftovers of an interrupted save (`.tmp-*`, `.old-*`) are removed by the next save.

The run state carries the run's identity (namespace/name): a run never resumes from another
run's checkpoints that share its path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

LATEST = "latest"
STATE_FILE = "run_state.json"
_STEP_RE = re.compile(r"^step-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint directory that this run must not, or cannot, resume from."""


def complete_steps(directory: str | Path) -> list[Path]:
    """Complete checkpoints under directory, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir()
             if (m := _STEP_RE.match(p.name)) and (p / STATE_FILE).is_file()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest complete checkpoint under directory, or None."""
    directory = Path(directory)
    pointer = directory / LATEST
    if pointer.is_file():
        path = directory / pointer.read_text().strip()
        if (path / STATE_FILE).is_file():
            newest = complete_steps(directory)
            # `latest` is written after the rename; a crash between the two leaves it one behind.
            return newest[-1] if newest and step_of(newest[-1]) > step_of(path) else path
    steps = complete_steps(directory)
    return steps[-1] if steps else None


def step_of(path: Path) -> int:
    """The step a checkpoint directory holds (step-00000050 -> 50; -1 for any other name)."""
    m = _STEP_RE.match(path.name)
    return int(m.group(1)) if m else -1


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def newest_common_step(per_rank: list[list[int]]) -> tuple[int | None, list[int]]:
    """The newest step every rank holds complete, and the newer steps some rank lacks (newest first)."""
    if not per_rank:
        return None, []
    held = [set(steps) for steps in per_rank]
    common = set.intersection(*held)
    newest = max(common) if common else None
    partial = sorted((s for s in set.union(*held) if newest is None or s > newest), reverse=True)
    return newest, partial


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under root (and root) to stable storage."""
    for dirpath, _, files in os.walk(root):
        for f in files:
            _fsync(Path(dirpath) / f)
        _fsync(Path(dirpath))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on directories; the data is still written
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync(path.parent)


def finish(tmp: Path, final: Path, state: dict, keep: int) -> Path:
    """The owner, after every rank wrote its shards: flush, rename, the run state (the marker), point
    `latest`, prune."""
    (tmp / STATE_FILE).unlink(missing_ok=True)  # the marker comes last, never through the rename
    fsync_tree(tmp)
    base = final.parent
    old = base / f".old-{final.name}"
    if final.exists():
        # A checkpoint of the same step (e.g. saved again after a resume): keep the old one
        # until the new one has its name and `latest`.
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync(base)
    write_atomic(final / STATE_FILE, json.dumps(state, indent=1, sort_keys=True))
    write_atomic(base / LATEST, final.name + "\n")
    shutil.rmtree(old, ignore_errors=True)
    steps = complete_steps(base)
    for stale in steps[: max(0, len(steps) - keep)]:
        if stale != final:
            shutil.rmtree(stale, ignore_errors=True)
    for leftover in base.glob(".tmp-step-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    for leftover in base.glob(".old-step-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    return final


def read_state(path: Path) -> dict:
    return json.loads((path / STATE_FILE).read_text())


def check_identity(path: Path, run_id: str) -> None:
    """Refuse a checkpoint written by another run (two runs given the same checkpoint.path)."""
    saved = (read_state(path).get("run") or {}).get("run_id") or ""
    if run_id and saved and saved != run_id:
        raise CheckpointError(
            f"spec.checkpoint.path: {path.parent} holds checkpoints of run {saved!r}, not of {run_id!r}; "
            "give this run a path of its own (or delete those checkpoints to start over there)")
