"""Malformed RLRuns refused by the real API server (the CRD's schema and CEL rules) as `rlscale validate`
refuses them, naming the field; and the well-formed edge cases accepted by both (issue 42, item 2)."""

from __future__ import annotations

import json

import pytest
from clusterkit import example_run

from rlscale.spec import SpecError, parse_spec
from rlscale.spec.syntax import ENV_TOTAL_MAX, ENV_VALUE_MAX

pytestmark = pytest.mark.cluster


def _pod(role: str, **pod) -> dict:
    return {role: {"pod": pod}}


def _mount(path: str, **more) -> dict:
    return _pod("learner", volumes=[{"name": "data", "emptyDir": {}}],
                volumeMounts=[{"name": "data", "mountPath": path, **more}])


# (spec fields over the example, what the API server's refusal must say: the field, and the rule's words)
REFUSED = [
    ({"budget": {"gpus": 16, "maxSamples": 2**53}}, "spec.budget.maxSamples"),
    ({"hardware": {"accelerator": "H100", "memoryBandwidth": 1e-300}}, "spec.hardware.memoryBandwidth"),
    ({"hardware": {"accelerator": "H100", "peakFlops": 1e30}}, "spec.hardware.peakFlops"),
    (_pod("learner", labels={"team": "a b"}), "spec.learner.pod.labels.team"),
    (_pod("learner", labels={"bad key": "x"}), "learner.pod.labels keys must be valid label keys"),
    (_pod("learner", labels={"x" * 64: "y"}), "learner.pod.labels keys must be valid label keys"),
    (_pod("rollout", labels={"rlscale.dev/run": "other"}), "rollout.pod.labels keys must be valid label keys"),
    (_pod("rollout", annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}),
     "rollout.pod.annotations keys must be valid label keys"),
    (_pod("learner", nodeSelector={"a/b/c": "x"}), "learner.pod.nodeSelector keys must be valid label keys"),
    (_pod("rollout", priorityClassName="System_Critical"), "spec.rollout.pod.priorityClassName"),
    (_pod("learner", imagePullSecrets=["Reg Cred"]), "spec.learner.pod.imagePullSecrets[0]"),
    ({"scheduling": {"schedulerName": "-x"}}, "spec.scheduling.schedulerName"),
    ({"scheduling": {"placementProfile": "h100.pool"}}, "spec.scheduling.placementProfile"),
    (_pod("learner", volumes=[{"name": "s", "secret": {"secretName": "Not/A/Name"}}]),
     "spec.learner.pod.volumes[0].secret.secretName"),
    (_mount("/etc/rlscale/."), "each learner.pod.volumeMounts mountPath must be absolute, in normal form"),
    (_mount("/models/../etc/rlscale"), "each learner.pod.volumeMounts mountPath must be absolute, in normal form"),
    (_mount("/etc/rlscale/config.json"), "each learner.pod.volumeMounts mountPath must be absolute"),
    (_mount("/data", subPath="../x"), "a subPath must not hold '..'"),
    (_mount("/data", mountPropagation="Bidirectional"), 'unknown field "spec.learner.pod.volumeMounts[0].'
     'mountPropagation"'),
    ({"checkpoint": {"path": "ckpt"}}, "checkpoint.path must be absolute, in normal form"),
    ({"checkpoint": {"path": "/etc/rlscale"}}, "checkpoint.path must be absolute, in normal form"),
    (_pod("learner", env=[{"name": "BIG", "value": "x" * (ENV_VALUE_MAX + 1)}]), "spec.learner.pod.env[0].value"),
    (_pod("learner", env=[{"name": f"V{i}", "value": "x" * (ENV_VALUE_MAX - 8)} for i in range(3)]),
     f"learner.pod.env names and values must hold at most {ENV_TOTAL_MAX} characters"),
    ({"task": {"reward": "exact-match\n"}}, "task.reward must be exact-match, math, format"),
    (_pod("learner", imagePullSecrets=["other-ray-token"]), "learner.pod.imagePullSecrets must name no Secret"),
    ({"checkpoint": {"keep": 1}}, "checkpoint.keep must be at least 2 unless checkpoint.volume is set"),
    ({"activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds"),
    ({"failurePolicy": {"podStartTimeoutSeconds": -1}}, "spec.failurePolicy.podStartTimeoutSeconds"),
    ({"optimizer": {"lrSchedule": "cosine", "warmupSteps": 10, "decaySteps": 10}},
     "optimizer.decaySteps (unset: budget.maxSteps) must exceed optimizer.warmupSteps"),
    ({"optimizer": {"decaySteps": 100}}, "optimizer.decaySteps needs lrSchedule linear or cosine"),
    ({"rollout": {"topK": -2}}, "spec.rollout.topK"),
    ({"task": {"toolSandbox": {"isolation": "pod"}}}, "task.toolSandbox needs task.tools"),
    ({"task": {"tools": [{"name": "c", "builtin": "calculator"}], "toolSandbox": {"runtimeClassName": "gvisor"}}},
     "task.toolSandbox.runtimeClassName and replicas need task.toolSandbox.isolation: pod"),
    ({"task": {"tools": [{"name": "c", "builtin": "calculator"}], "toolSandbox": {"isolation": "pod",
                                                                                "runtimeClassName": "Not_A_Name"}}},
     "spec.task.toolSandbox.runtimeClassName"),
]


@pytest.mark.parametrize("over,message", REFUSED, ids=[f"{i}-{r[1][:40]}" for i, r in enumerate(REFUSED)])
def test_malformed_runs_are_refused_at_admission_and_by_validate(kube, ns, over, message):
    obj = example_run("bad", **over)
    out = kube.apply(obj, ns, check=False)
    assert out.returncode != 0, f"the API server took {json.dumps(over)[:200]}"
    assert message in out.stderr, out.stderr[-2000:]
    assert kube.get("rlrun", "bad", ns) is None
    with pytest.raises(SpecError):  # and `validate` refuses it too
        parse_spec(obj["spec"])


WELL_FORMED = [
    _pod("learner", labels={"team": "nlp", "example.com/cost-center": "a-1", "empty": ""},
         annotations={"example.com/owner": "x" * 4096}, nodeSelector={"nvidia.com/gpu.product": "H100"}),
    _mount("/data/cache", subPath="models/qwen", readOnly=True),
    _mount("/tmpdata"),
    {"checkpoint": {"path": "/mnt/ckpt"}},
    {"checkpoint": {"keep": 1, "volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}}},
    _pod("learner", env=[{"name": f"V{i}", "value": "x" * 20000} for i in range(3)]),
    {"hardware": {"accelerator": "H100", "memoryBandwidth": 3.35e12, "peakFlops": 9.89e14, "memory": 8.0e10}},
    {"optimizer": {"lrSchedule": "cosine", "warmupSteps": 10}, "rollout": {"topK": 50, "minP": 0.05,
                                                                          "repetitionPenalty": 1.1}},
    {"task": {"tools": [{"name": "c", "builtin": "calculator"}], "toolSandbox": {"isolation": "process"}}},
    {"task": {"tools": [{"name": "c", "builtin": "calculator"}], "toolSandbox": {"isolation": "pod", "replicas": 2,
                                                                                "runtimeClassName": "gvisor"}}},
]


@pytest.mark.parametrize("over", WELL_FORMED)
def test_well_formed_edge_cases_pass_both(kube, ns, over):
    obj = example_run("good", **over)
    parse_spec(obj["spec"])
    out = kube.apply(obj, ns, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
