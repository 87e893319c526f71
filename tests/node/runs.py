"""What the real-node run tests share: waiting on a condition, and reading a run's objects,
pods and report through kubectl and its checkpoint claim (a hostPath on this machine)."""

from __future__ import annotations

import json
from pathlib import Path

from rlscale.operator import constants as C
from tests.conftest import wait_for as wait  # noqa: F401  (the node tests' name for it)


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file (none when it is missing; a line cut short by a writer is skipped)."""
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


class RunView:
    """One RLRun in one namespace, as the tests look at it."""

    def __init__(self, kubectl, namespace: str, run: str, checkpoints: Path | None = None):
        self.kubectl, self.ns, self.run, self.checkpoints = kubectl, namespace, run, checkpoints

    def get(self, kind: str, name: str | None = None, selector: str | None = None, ns: str | None = None):
        args = ["get", kind, *([name] if name else []), "-n", ns or self.ns, "-o", "json",
                *(["-l", selector] if selector else [])]
        out = self.kubectl(*args, check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def rlrun(self) -> dict:
        return self.get("rlrun", self.run) or {}

    def status(self) -> dict:
        return self.rlrun().get("status") or {}

    def conditions(self) -> dict[str, dict]:
        return {x["type"]: x for x in self.status().get("conditions", [])}

    def step(self) -> int:
        """The step in status.progress (0 before the first report)."""
        return int((self.status().get("progress") or {}).get("step") or 0)

    def pods(self, role: str | None = None) -> list[dict]:
        sel = f"{C.LABEL_RUN}={self.run}" + (f",{C.LABEL_ROLE}={role}" if role else "")
        return (self.get("pods", selector=sel) or {}).get("items", [])

    def running(self, role: str) -> list[dict]:
        return [p for p in self.pods(role) if p["status"].get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")
                and all(cs.get("ready") for cs in p["status"].get("containerStatuses", []))]

    def logged(self) -> list[dict]:
        """report/metrics.jsonl on the checkpoint claim: one record per step the run kept."""
        return read_jsonl(self.checkpoints / "report" / "metrics.jsonl")

    def redone(self) -> list[dict]:
        """report/metrics.redone.jsonl: steps logged, then lost to a restart and done again."""
        return read_jsonl(self.checkpoints / "report" / "metrics.redone.jsonl")

    def checkpoint_steps(self) -> list[int]:
        """The complete checkpoints on the claim (step-N folders), oldest first."""
        return sorted(int(p.name.split("-")[1]) for p in self.checkpoints.glob("step-*") if p.is_dir())
