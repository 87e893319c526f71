"""Atomic checkpoints: the DeepSpeed engines' state plus the run state, under one directory per step.

Layout: DIR/step-00000050/{policy/, critic/, run_state.json} and DIR/latest naming the
newest complete one. A checkpoint is written to DIR/.tmp-step-N and renamed only when
every rank has finished, so a crash mid-write leaves the last good one in place.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

LATEST = "latest"
STATE_FILE = "run_state.json"


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest complete checkpoint under directory, or None."""
    directory = Path(directory)
    pointer = directory / LATEST
    if not pointer.is_file():
        return None
    path = directory / pointer.read_text().strip()
    return path if (path / STATE_FILE).is_file() else None


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def finish(tmp: Path, final: Path, state: dict, keep: int) -> Path:
    """Rank 0, after every rank wrote its shards: run state, rename, point `latest`, prune."""
    write_atomic(tmp / STATE_FILE, json.dumps(state, indent=1, sort_keys=True))
    if final.exists():
        # A checkpoint of the same step (e.g. after a resume) is replaced whole.
        shutil.rmtree(final)
    os.rename(tmp, final)
    write_atomic(final.parent / LATEST, final.name + "\n")
    steps = sorted(p for p in final.parent.glob("step-*") if p.is_dir())
    for old in steps[: max(0, len(steps) - keep)]:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def read_state(path: Path) -> dict:
    return json.loads((path / STATE_FILE).read_text())
