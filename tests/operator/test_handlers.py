"""The kopf side: handlers registered with the operator's settings, the runs' pods and workloads indexed,
a pod event that changes nothing of the run's health skipped; the settings the chart sets."""

from __future__ import annotations

import re

import kopf
from fakekube import FakeKube

from rlscale.operator import builders as B
from rlscale.operator import constants as C
from rlscale.operator import settings as OS
from rlscale.operator.handlers import INDEX_DEPLOYMENTS, INDEX_PODS, INDEX_STATEFULSETS, Handlers
from rlscale.operator.observed import IndexObserver, index_entry
from rlscale.operator.policy import Policy
from tests.conftest import ROOT


class Recorder:
    """A Controller that only records the passes asked of it."""

    def __init__(self) -> None:
        self.passes: list[tuple[str, str, str]] = []
        self.gone: list[list[dict]] = []  # the deleted pods each pass was handed
        self.api = FakeKube()  # no RLRun in it: a deleted pod's run is not stopping

    def reconcile(self, namespace, name, trigger, gone=(), **_):
        self.passes.append((namespace, name, trigger))
        self.gone.append(list(gone))


def registered(settings: OS.OperatorSettings) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    Handlers(Recorder(), settings).register(registry)
    return registry


def test_handlers_keep_their_ids_and_the_timer_takes_the_settings_interval():
    registry = registered(OS.OperatorSettings(progress_interval=3.5))
    (timer,) = registry._spawning.get_all_handlers()
    assert (timer.id, timer.interval, timer.initial_delay) == ("progress_timer", 3.5, 3.5)
    # kopf keeps a handler's progress on the RLRun under its id: the ids of the module functions.
    assert {h.id for h in registry._changing.get_all_handlers()} == {"reconcile_rlrun", "reconcile_rlrun/spec",
                                                                      "rlrun_deleted"}
    assert [h.id for h in registry._indexing.get_all_handlers()] == [INDEX_PODS, INDEX_DEPLOYMENTS,
                                                                      INDEX_STATEFULSETS]
    # Its own registry: kopf's login and our start-up settings are registered with the rest.
    assert {h.id for h in registry._activities.get_all_handlers()} == {"login_via_client", "configure"}


def pod(restarts: int, waiting: str | None = None) -> dict:
    state = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
    return {"metadata": {"name": "r-learner-0", "namespace": "ns", "labels": B.labels("r", C.ROLE_LEARNER)},
            "status": {"containerStatuses": [{"name": "learner", "restartCount": restarts, "state": state}]}}


def test_a_pod_event_runs_a_pass_only_when_the_pods_health_moved():
    rec = Recorder()
    h = Handlers(rec, OS.OperatorSettings())
    memo = kopf.Memo()
    indexes = {INDEX_PODS: {}, INDEX_DEPLOYMENTS: {}, INDEX_STATEFULSETS: {}}

    def event(body, type_="MODIFIED"):
        h.pod_event(type=type_, body=body, labels=body["metadata"]["labels"], namespace="ns", memo=memo, **indexes)

    event(pod(0))  # a new healthy pod: nothing to say
    assert rec.passes == []
    event(pod(1, "CrashLoopBackOff"))
    event(pod(1, "CrashLoopBackOff"))  # the same again
    assert rec.passes == [("ns", "r", "pod")]
    event(pod(1))  # running again (its restart still counts toward the backoff limit)
    assert rec.passes == [("ns", "r", "pod")] * 2
    event(pod(0), "DELETED")  # a healthy pod going changes nothing; a failing one may clear Degraded
    event(pod(1, "CrashLoopBackOff"), "DELETED")
    assert rec.passes == [("ns", "r", "pod")] * 3 and rec.gone[-1] == []
    # An evicted pod's going is a fault the pass counts, though no pass may have seen it evicted.
    evicted = pod(0)
    evicted["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True",
                                        "reason": "EvictionByEvictionAPI"}]
    event(evicted, "MODIFIED")
    event(evicted, "DELETED")
    assert rec.passes == [("ns", "r", "pod")] * 5 and rec.gone[-2:] == [[], [evicted]]


def test_the_index_keeps_what_a_pass_reads_by_run():
    body = {**pod(2), "spec": {"replicas": 3, "template": {"spec": {"containers": []}}}}
    ((key, entry),) = index_entry(body, spec_keys=("replicas",)).items()
    assert key == ("ns", "r") and entry["spec"] == {"replicas": 3} and entry["status"] == body["status"]
    assert index_entry({"metadata": {"name": "x", "labels": {}}}) is None
    obs = IndexObserver({key: [entry]}, {key: [entry]})
    assert obs.pods("ns", "r") == [entry] and obs.workloads("ns", "r") == {C.ROLE_LEARNER: entry}
    assert obs.pods("ns", "other") == []


def test_settings_come_from_the_environment_the_chart_sets():
    chart = (ROOT / "charts" / "rlscale" / "templates" / "deployment.yaml").read_text()
    names = set(re.findall(r"name: (RLSCALE_\w+)", chart))
    assert names and names <= set(OS.ENV_NAMES), names - set(OS.ENV_NAMES)
    s = OS.OperatorSettings.from_env({OS.ENV_PROGRESS_INTERVAL: "2.5", OS.ENV_CHECKPOINT_STORAGE: "50Gi",
                                      OS.ENV_WORKERS: "3", OS.ENV_STEP_DELAY: "0.5", OS.ENV_NETWORK_POLICY: "true"})
    assert (s.progress_interval, s.children.checkpoint_storage, s.workers, s.step_delay) == (2.5, "50Gi", 3, 0.5)
    assert s.children.network_policy and s.children.metrics_from == ("monitoring",)
    assert OS.OperatorSettings.from_env({}) == OS.OperatorSettings()


def test_policy_settings_come_from_the_environment():
    s = OS.OperatorSettings.from_env({OS.ENV_IMAGE_PREFIXES: "reg.example/ml/, ghcr.io/rlscale/,",
                                      OS.ENV_RUNTIME_CLASSES: "nvidia", OS.ENV_PRIORITY_CLASSES: "",
                                      OS.ENV_TOLERATION_KEYS: "nvidia.com/gpu", OS.ENV_NODE_LABEL_KEYS: "pool,zone",
                                      OS.ENV_SCHEDULERS: "volcano", OS.ENV_SECRET_NAMES: "hf-token",
                                      OS.ENV_CLAIM_NAMES: "models", OS.ENV_REQUIRE_POD_SECURITY: "false",
                                      OS.ENV_ALLOW_BLOCKING_EVICTIONS: "true", OS.ENV_CLAIM_LABEL: " team=a "})
    p = s.policy
    assert p.image_prefixes == ("reg.example/ml/", "ghcr.io/rlscale/")
    assert (p.runtime_class_names, p.priority_class_names, s.require_pod_security) == (("nvidia",), (), False)
    assert (p.toleration_keys, p.node_label_keys, p.scheduler_names) == (("nvidia.com/gpu",), ("pool", "zone"),
                                                                        ("volcano",))
    assert (p.secret_names, p.claim_names, p.allow_blocking_evictions) == (("hf-token",), ("models",), True)
    assert (p.claim_label, p.secret_label) == ("team=a", "")
    # Unset: nothing allowed, and the namespace must enforce Pod Security.
    d = OS.OperatorSettings.from_env({})
    assert d.policy == Policy() and all(v in ((), False, "") for v in vars(d.policy).values())
    assert d.require_pod_security
