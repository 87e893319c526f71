"""What the real-node run tests share: waiting on a condition, and reading a run's objects,
pods and report through kubectl and its checkpoint claim (a hostPath on this machine)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from hack import cluster as cp
from hack.cluster import quickstart as qs
from rlscale.operator import constants as C
from tests.conftest import wait_for as wait

RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"}
ENDED = (C.PHASE_BUDGET_EXHAUSTED, C.PHASE_SUCCEEDED, C.PHASE_FAILED)


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


@dataclass
class RunFacts:
    """What a module's run fixture read while its run went and once it ended."""

    status: dict = field(default_factory=dict)
    records: list[dict] = field(default_factory=list)  # report/metrics.jsonl on the checkpoint claim
    learner_log: str = ""
    seconds: float = 0.0  # from `kubectl apply` to the run's end


@contextmanager
def applied_run(cluster, ns: str, obj: dict, checkpoints: Path, poll: Callable[[], None] | None = None,
                timeout: float = 1200) -> Iterator[tuple[RunView, float]]:
    """The chart installed (a no-op when an earlier test installed it), namespace `ns` (Pod Security
    restricted) with the README's claims (the model cache, the report on `checkpoints`), the RLRun `obj`
    applied there and waited for until it ends (`poll()` each round while it runs, to read what goes with
    its pods); yields its view and the seconds from apply to the end. The namespace and the claims' volumes
    are deleted afterwards."""
    kubectl = cluster.kubectl
    qs.helm_install(cp.bin_dir() / "helm", cluster.kubeconfig)
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": ns, "labels": RESTRICTED}}))
    claims = qs.claims(ns, qs.model_cache(), checkpoints)
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": claims}))
    view = RunView(kubectl, ns, obj["metadata"]["name"], checkpoints)
    t0 = time.monotonic()
    try:
        kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(obj))

        def ended() -> bool:
            if poll is not None:
                poll()
            return view.status().get("phase") in ENDED
        wait(f"{view.run} to end", ended, timeout, 3)
        yield view, time.monotonic() - t0
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
        for item in claims:
            if item["kind"] == "PersistentVolume":
                kubectl("delete", "pv", item["metadata"]["name"], "--wait=false", "--ignore-not-found", check=False)
