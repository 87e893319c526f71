"""`make test TEST_LANES=2`'s two lanes (hack/test-lanes.sh runs one pytest process per lane, side by side).

Most of the suite's wall time is waiting: pods starting, API-server round trips, image imports, Ray
and vLLM start-ups. So the suite runs as two pytest processes at once, split by folder:

- k8s: what needs a control plane, a node or the images (tests/operator, tests/node, tests/images);
- local: everything else (the unit tests, the vLLM/Ray/DeepSpeed tests, tests/e2e).

The split keeps each shared host resource in one lane: every Ray cluster on this host (local Ray
heads pick ports that collide when two start at once, tests/rollout/test_scaling.py) is in the local
lane, every podman build and containerd (the node's, tests/images') in the k8s lane; the kwok control
plane and the real node's pick free ports and run side by side. Each lane starts its session fixtures
once (the kwok cluster, the node cluster, Prometheus, shared engines)."""

from __future__ import annotations

from pathlib import Path

LANES = ("k8s", "local")
K8S_DIRS = ("tests/operator/", "tests/node/", "tests/images/")


def lane_of(nodeid: str) -> str:
    """The lane of a test, from its node id (the path relative to the repository root first)."""
    path = nodeid.split("::", 1)[0].replace("\\", "/").removeprefix("./")
    return "k8s" if path.startswith(K8S_DIRS) else "local"


class LanePlugin:
    """--lane's hooks (tests/conftest.py registers them): the other lane's folders and files are not even
    imported (collecting the local lane's modules imports torch, vLLM and transformers: about 20 s of CPU the
    k8s lane needs none of), and what is still collected (a file named on the command line) is deselected."""

    def __init__(self, lane: str, root: Path):
        self.lane, self.root = lane, root

    def pytest_ignore_collect(self, collection_path: Path, config):
        try:
            rel = collection_path.resolve().relative_to(self.root).as_posix()
        except ValueError:
            return None
        if collection_path.is_dir():
            rel = "" if rel == "." else rel + "/"
        if any(d.startswith(rel) for d in K8S_DIRS):  # tests/ itself holds both lanes
            return None
        return True if lane_of(rel) != self.lane else None

    def pytest_collection_modifyitems(self, config, items):
        # Node ids are relative to the rootdir, the repository root (pyproject.toml's pytest section).
        config.hook.pytest_deselected(items=[item for item in items if lane_of(item.nodeid) != self.lane])
        items[:] = [item for item in items if lane_of(item.nodeid) == self.lane]


def lane_seconds(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Seconds per lane and file from a profile's rows (hack/pytest_timelog.py: {"id": nodeid, "s": seconds})."""
    out: dict[str, dict[str, float]] = {lane: {} for lane in LANES}
    for r in rows:
        files = out[lane_of(r["id"])]
        path = r["id"].split("::", 1)[0]
        files[path] = files.get(path, 0.0) + float(r["s"])
    return out


def main(argv: list[str]) -> int:
    """python -m tests.lanes PROFILE.jsonl...: each lane's summed test seconds, its largest files first
    (what one lane would take alone; a lane's wall time is its sum plus collection)."""
    import json

    if not argv:
        print("usage: python -m tests.lanes PROFILE.jsonl... (written by hack/pytest_timelog.py)")
        return 2
    rows = [json.loads(ln) for p in argv for ln in open(p) if ln.strip()]
    for lane, files in lane_seconds(rows).items():
        print(f"{lane}: {sum(files.values()) / 60:.1f} min in {len(files)} files")
        for path, s in sorted(files.items(), key=lambda kv: -kv[1])[:8]:
            print(f"  {s / 60:6.1f} min  {path}")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
