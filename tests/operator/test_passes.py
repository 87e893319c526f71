"""One pass per run at a time (issue 42, item 4): kopf runs a run's handlers (its timer, its children's
events) in a thread pool, and two passes at once would apply children built from two different reads."""

from __future__ import annotations

import threading
import time

import yaml
from fakekube import FakeKube
from policykit import SETTINGS

from rlscale.operator import constants as C
from rlscale.operator.kube import RLRUN_API
from rlscale.operator.reconcile import Controller
from tests.conftest import EXAMPLES

NS = "team"


class Slow(FakeKube):
    """Applies take a while, and the fake counts the passes inside apply at once, per run."""

    def __init__(self) -> None:
        super().__init__()
        self.inside: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self.applied: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def apply(self, manifest):
        run = manifest["metadata"]["labels"].get(C.LABEL_RUN, "")
        with self._lock:
            self.inside[run] = self.inside.get(run, 0) + 1
            self.most[run] = max(self.most.get(run, 0), self.inside[run])
            key = (manifest["kind"], manifest["metadata"]["name"])
            self.applied[key] = self.applied.get(key, 0) + 1
        try:
            time.sleep(0.01)
            return super().apply(manifest)
        finally:
            with self._lock:
                self.inside[run] -= 1


def _create(fake: FakeKube, name: str) -> dict:
    obj = yaml.safe_load((EXAMPLES / "grpo-h100.yaml").read_text())
    obj["metadata"] = {"name": name, "namespace": NS}
    return fake.create(obj)


def test_two_passes_of_one_run_take_turns_and_the_second_reads_the_run_anew():
    fake = Slow()
    fake.namespace(NS, **{"pod-security.kubernetes.io/enforce": "restricted"})
    body = _create(fake, "r")
    _create(fake, "s")
    ctl = Controller(fake, SETTINGS)
    errors: list[BaseException] = []

    def run(name: str, trigger: str, with_body: bool) -> None:
        try:
            ctl.reconcile(NS, name, trigger, body=body if with_body else None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    # Both passes of r hold the RLRun as it was before either ran (kopf's body), as a create and a
    # timer pass that kopf started together would.
    threads = [threading.Thread(target=run, args=("r", "create", True)),
               threading.Thread(target=run, args=("r", "resume", True)),
               threading.Thread(target=run, args=("s", "create", False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert fake.most["r"] == 1  # r's passes never applied at once
    assert fake.most.get("s") == 1
    st = fake.get(RLRUN_API, C.RLRUN_KIND, NS, "r")["status"]
    assert st["phase"] and st["plan"]
    # The second pass read the run the first had written: it kept that plan (Planned at this generation),
    # so every child of r carries the one plan's hash.
    hashes = {fake.get("apps/v1", kind, NS, f"r-{role}")["metadata"]["annotations"][C.ANNOTATION_PLAN_HASH]
              for kind, role in (("Deployment", "rollout"), ("StatefulSet", "learner"))}
    assert len(hashes) == 1
    assert sorted(k[3] for k in fake.objects if k[1] == "Secret") == ["r-ray-token", "s-ray-token"]
