"""The base model a LoRA checkpoint belongs to: an adapter resumed on another base trains something else, so
the checkpoint keeps the base's identity and a resume compares it (learner._load_checkpoint)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

EDGE_BYTES = 2**20  # hashed at each end of every weights file: cheap for a 15 GB model, different for any other


def base_identity(model_path: str | Path) -> dict[str, Any]:
    """config.json's hash and, per weights file, its size and the hash of its first and last MiB (safetensors
    files open with their tensors' names, shapes and offsets, and end with weights)."""
    root = Path(model_path)
    h = hashlib.sha256()
    cfg = root / "config.json"
    if cfg.is_file():
        h.update(cfg.read_bytes())
    files = sorted(p for p in root.iterdir() if p.suffix in (".safetensors", ".bin", ".gguf")) if root.is_dir() else []
    for p in files:
        size = p.stat().st_size
        h.update(f"{p.name}:{size}".encode())
        with p.open("rb") as f:
            h.update(f.read(EDGE_BYTES))
            f.seek(max(0, size - EDGE_BYTES))
            h.update(f.read(EDGE_BYTES))
    return {"path": str(root), "sha256": h.hexdigest()}


def check_same_base(saved: dict[str, Any] | None, now: dict[str, Any], lora: dict[str, Any] | None,
                    checkpoint: str) -> None:
    """Raise when a checkpoint's LoRA state does not fit this run: another base, another adapter shape, or a
    full-model checkpoint under spec.lora (or the reverse)."""
    if saved is None and lora is None:
        return
    if saved is None or lora is None:
        have = "a full-model checkpoint" if saved is None else "a LoRA checkpoint"
        raise RuntimeError(f"learner: {checkpoint} is {have} and this run {'sets' if lora else 'has no'} spec.lora; "
                           "resume with the spec it was written with, or delete it to start afresh")
    if saved.get("base", {}).get("sha256") != now["sha256"]:
        raise RuntimeError(f"learner: {checkpoint} holds an adapter trained on the base at "
                           f"{saved.get('base', {}).get('path')!r}, not on this run's {now['path']!r} (their files "
                           "differ); resume with that base (spec.model.path), or delete the checkpoint")
    keys = ("r", "lora_alpha", "target_modules", "modules_to_save")
    old, new = ({k: (c or {}).get(k) for k in keys} for c in (saved.get("config"), lora))
    if old != new:
        raise RuntimeError(f"learner: {checkpoint}'s adapter was {json.dumps(old)}, spec.lora now gives "
                           f"{json.dumps(new)}; restore spec.lora, or delete the checkpoint to start afresh")
