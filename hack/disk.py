"""Is there room for `make test`? Checks the free space where the suite writes (the repository,
~/.cache/rlscale, the temp dir) before anything is built, and fails at once, naming what takes the
space, rather than an hour later in a node that has no room left for its images.

Usage: python3 hack/disk.py [--need-gb N]   (default: RLSCALE_TEST_MIN_FREE_GB, else MIN_FREE_GB)

Stdlib only: it runs before the venv exists."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# A warm `make test` in a fresh clone took the free space from 28.5 to 16.2 GB at its lowest (`df`
# every 10 s beside `time .ci/run`, stop 49): 12.3 GB, the clone's venv hard-linked from ~/.cache/uv. A
# clone on another filesystem copies that venv (6.9 GB), so 20.
MIN_FREE_GB = 20.0
GB = 1e9


def cache_dir() -> Path:
    return Path(os.environ.get("RLSCALE_CACHE") or Path.home() / ".cache" / "rlscale")


def places() -> dict[str, Path]:
    return {"repository": REPO, "cache": cache_dir(), "temp": Path(tempfile.gettempdir())}


def largest(paths: list[Path], top: int = 8) -> list[tuple[int, str]]:
    """The biggest folders one level under each path, by `du` (hard links counted once)."""
    entries = [str(c) for p in paths if p.is_dir() for c in p.iterdir() if c.is_dir()]
    if not entries:
        return []
    out = subprocess.run(["du", "-s", "--block-size=1", *entries], capture_output=True, text=True, timeout=600)
    sizes = []
    for line in out.stdout.splitlines():
        size, _, name = line.partition("\t")
        sizes.append((int(size), name))
    return sorted(sizes, reverse=True)[:top]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--need-gb", type=float,
                    default=float(os.environ.get("RLSCALE_TEST_MIN_FREE_GB") or MIN_FREE_GB))
    args = ap.parse_args(argv)
    names: dict[int, list[str]] = {}  # filesystem (st_dev) -> the places on it
    free: dict[int, float] = {}
    for name, path in places().items():
        path.mkdir(parents=True, exist_ok=True)
        dev = path.stat().st_dev
        free[dev] = shutil.disk_usage(path).free / GB
        names.setdefault(dev, []).append(f"{name} ({path})")
    for dev, gb in free.items():
        print(f"[disk] {gb:.1f} GB free for {', '.join(names[dev])}")
    if min(free.values()) >= args.need_gb:
        return 0
    print(f"\nmake test: under {args.need_gb:g} GB free where the suite writes: a warm run writes about that much "
          "(images imported into the test node, the clusters' state, checkpoints), and a suite out of disk "
          "fails far from the cause.\nThe largest folders there:", file=sys.stderr)
    for size, name in largest([cache_dir(), Path(tempfile.gettempdir()), Path.home() / ".cache"]):
        print(f"  {size / GB:6.1f} GB  {name}", file=sys.stderr)
    print("Fix: free space (old pytest runs under the temp dir's pytest-of-*, `go clean -cache`, "
          "`uv cache prune`), or set RLSCALE_TEST_MIN_FREE_GB lower to run anyway.", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
