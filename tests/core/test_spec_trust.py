"""What an RLRun may ask for: counts the planner can enumerate, volume sources from an allowlist,
and no reach into another run's Ray token Secret. Each refusal names the field and the fix."""

from __future__ import annotations

import pytest

from rlscale.crd import crd
from rlscale.spec import MAX_PROMPTS, MAX_REPLICAS, MAX_SAMPLES_PER_PROMPT, SpecError, parse_spec
from rlscale.spec.syntax import MAX_GPUS_PER_POD

CPU = {"hardware": {"accelerator": "cpu"}}


def errors_of(spec: dict) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec({**CPU, **spec})
    return [str(e) for e in info.value.errors]


def _spec_schema() -> dict:
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


BOUNDS = [
    ({"rollout": {"maxReplicas": MAX_REPLICAS + 1}}, "spec.rollout.maxReplicas", MAX_REPLICAS),
    ({"learner": {"maxReplicas": MAX_REPLICAS + 1}}, "spec.learner.maxReplicas", MAX_REPLICAS),
    ({"batch": {"maxPrompts": MAX_PROMPTS + 1}}, "spec.batch.maxPrompts", MAX_PROMPTS),
    ({"batch": {"minPrompts": MAX_PROMPTS + 1}}, "spec.batch.minPrompts", MAX_PROMPTS),
    ({"batch": {"samplesPerPrompt": MAX_SAMPLES_PER_PROMPT + 1}}, "spec.batch.samplesPerPrompt",
     MAX_SAMPLES_PER_PROMPT),
]


@pytest.mark.parametrize("spec,field,bound", BOUNDS, ids=[b[1] for b in BOUNDS])
def test_planner_counts_are_bounded(spec, field, bound):
    errs = errors_of(spec)
    assert any(e.startswith(field + ":") and f"less than or equal to {bound}" in e for e in errs), errs


def test_bounds_are_in_the_crd_schema():
    s = _spec_schema()["properties"]
    for role in ("rollout", "learner"):
        assert s[role]["properties"]["maxReplicas"]["maximum"] == MAX_REPLICAS
    assert s["batch"]["properties"]["maxPrompts"]["maximum"] == MAX_PROMPTS
    assert s["batch"]["properties"]["samplesPerPrompt"]["maximum"] == MAX_SAMPLES_PER_PROMPT


def test_explicit_replicas_are_bounded_through_max_replicas():
    errs = errors_of({"learner": {"replicas": MAX_REPLICAS + 1, "maxReplicas": MAX_REPLICAS}})
    assert any(e.startswith("spec.learner.replicas:") and f"at most {MAX_REPLICAS}" in e for e in errs), errs


def test_bounds_keep_the_defaults():
    s = parse_spec(CPU)
    assert (s.rollout.max_replicas, s.learner.max_replicas, s.batch.max_prompts, s.batch.samples_per_prompt) == \
        (8, 8, 256, 8)


def _pod(role: str, **pod) -> dict:
    return {role: {"pod": pod}}


# (spec, the field the error must name, a word of the fix)
REFUSED = [
    (_pod("rollout", volumes=[{"name": "h", "hostPath": {"path": "/"}}]), "spec.rollout.pod.volumes[0].hostPath",
     "persistentVolumeClaim bound by your admin"),
    (_pod("learner", volumes=[{"name": "d", "emptyDir": {}}, {"name": "n", "nfs": {"server": "s", "path": "/"}}]),
     "spec.learner.pod.volumes[1].nfs", "persistentVolumeClaim bound by your admin"),
    (_pod("learner", volumes=[{"name": "c", "csi": {"driver": "x"}}]), "spec.learner.pod.volumes[0].csi",
     "allowed sources"),
    (_pod("rollout", volumes=[{"name": "d", "emptyDir": {}, "hostPath": {"path": "/"}}]),
     "spec.rollout.pod.volumes[0]", "exactly one volume source"),
    ({"task": {"reward": "m:f", "pluginVolume": {"hostPath": {"path": "/etc"}}}}, "spec.task.pluginVolume.hostPath",
     "persistentVolumeClaim bound by your admin"),
    ({"model": {"volume": {"iscsi": {"targetPortal": "x"}}}}, "spec.model.volume.iscsi", "allowed sources"),
    ({"checkpoint": {"volume": {"flexVolume": {"driver": "x"}}}}, "spec.checkpoint.volume.flexVolume",
     "allowed sources"),
    (_pod("learner", volumes=[{"name": "t", "secret": {"secretName": "other-run-ray-token"}}]),
     "spec.learner.pod.volumes[0].secret.secretName", "a Secret of your own"),
    ({"task": {"reward": "m:f", "pluginVolume": {"secret": {"secretName": "x-ray-token"}}}},
     "spec.task.pluginVolume.secret.secretName", "a Secret of your own"),
    (_pod("rollout", volumes=[{"name": "p", "projected": {"sources": [
        {"configMap": {"name": "c"}}, {"secret": {"name": "other-ray-token"}}]}}]),
     "spec.rollout.pod.volumes[0].projected.sources[1].secret.name", "a Secret of your own"),
    (_pod("rollout", volumes=[{"name": "p", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]),
     "spec.rollout.pod.volumes[0].projected.sources[0].serviceAccountToken", "configMap, secret, downwardAPI"),
    (_pod("learner", env=[{"name": "T", "valueFrom": {"secretKeyRef": {"name": "other-ray-token", "key": "token"}}}]),
     "spec.learner.pod.env[0].valueFrom.secretKeyRef.name", "a Secret of your own"),
    (_pod("rollout", env=[{"name": "T", "valueFrom": {"fileKeyRef": {"path": "p"}}}]),
     "spec.rollout.pod.env[0].valueFrom.fileKeyRef", "secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef"),
    (_pod("rollout", env=[{"name": "T", "valueFrom": {}}]), "spec.rollout.pod.env[0].valueFrom", "secretKeyRef"),
]


@pytest.mark.parametrize("spec,field,fix", REFUSED, ids=[r[1] for r in REFUSED])
def test_refusal_names_the_field_and_the_fix(spec, field, fix):
    errs = errors_of(spec)
    hit = [e for e in errs if e.startswith(field + ":")]
    assert hit, errs
    assert fix in hit[0], hit[0]


ALLOWED = [
    _pod("learner", volumes=[
        {"name": "a", "persistentVolumeClaim": {"claimName": "data"}}, {"name": "b", "configMap": {"name": "c"}},
        {"name": "c", "secret": {"secretName": "hf-token"}}, {"name": "d", "emptyDir": {"medium": "Memory"}},
        {"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
        {"name": "f", "downwardAPI": {"items": []}},
        {"name": "g", "projected": {"sources": [{"configMap": {"name": "c"}}, {"secret": {"name": "s"}},
                                                {"downwardAPI": {"items": []}}]}}]),
    _pod("rollout", env=[{"name": "A", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "t"}}},
                         {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
                         {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                         {"name": "D", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}]),
    {"task": {"reward": "m:f", "pluginVolume": {"configMap": {"name": "my-reward"}}},
     "model": {"volume": {"persistentVolumeClaim": {"claimName": "models"}}},
     "checkpoint": {"volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}}},
]


@pytest.mark.parametrize("spec", ALLOWED)
def test_allowlisted_sources_validate(spec):
    parse_spec({**CPU, **spec})


def test_the_crd_declares_only_the_allowed_sources():
    """Any other source is not in the schema: the API server refuses it (strict field validation)
    or prunes it, and the CEL rule then refuses a volume left without a source."""
    from rlscale.spec import VALUE_FROM_KINDS, VOLUME_SOURCES

    s = _spec_schema()["properties"]
    vol = s["learner"]["properties"]["pod"]["properties"]["volumes"]["items"]
    assert set(vol["properties"]) == {"name", *VOLUME_SOURCES}
    assert "x-kubernetes-preserve-unknown-fields" not in vol
    for src in (s["model"]["properties"]["volume"], s["task"]["properties"]["pluginVolume"],
                s["checkpoint"]["properties"]["volume"]):
        assert set(src["properties"]) == set(VOLUME_SOURCES) and "x-kubernetes-preserve-unknown-fields" not in src
    vf = s["rollout"]["properties"]["pod"]["properties"]["env"]["items"]["properties"]["valueFrom"]
    assert set(vf["properties"]) == set(VALUE_FROM_KINDS) and "x-kubernetes-preserve-unknown-fields" not in vf


def test_every_trust_rule_has_cel_that_reads_the_allowlist():
    from rlscale.spec import RAY_TOKEN_SECRET_SUFFIX
    from rlscale.spec.rules import RULES

    paths = {"model.volume", "checkpoint.volume", "task.pluginVolume", "rollout.pod.volumes", "learner.pod.volumes",
             "rollout.pod.env", "learner.pod.env"}
    for r in RULES:
        if r.path in paths and (r.path != "task.pluginVolume" or "exists_one" in r.cel):
            assert f"endsWith('{RAY_TOKEN_SECRET_SUFFIX}')" in r.cel and "exists_one" in r.cel, r.path
            paths.discard(r.path)
    assert not paths



# ---------------------------------------------------------------- malformed input (issue 42, item 2)

def _mount(path: str, **more) -> dict:
    return _pod("learner", volumes=[{"name": "data", "emptyDir": {}}],
                volumeMounts=[{"name": "data", "mountPath": path, **more}])


GPU = {"model": {"path": "Qwen/Qwen2.5-1.5B-Instruct"}, "hardware": {"accelerator": "H100"}}

# (spec, the field the error must name, a word of the problem or the fix)
MALFORMED = [
    ({"optimizer": {"lr": float("nan")}}, "spec.optimizer.lr", "finite"),
    ({"target": {"value": float("inf")}}, "spec.target.value", "finite"),
    ({"optimizer": {"lr": "nan"}}, "spec.optimizer.lr", "finite"),
    ({"rollout": {"resources": {"limits": {"cpu": float("inf")}}}}, "spec.rollout.resources.limits.cpu", "finite"),
    ({"budget": {"maxSamples": 2**53}}, "spec.budget.maxSamples", "2^53 - 1"),
    ({"learner": {"pod": {"affinity": {"x": [-(2**70)]}}}}, "spec.learner.pod.affinity.x[0]", "2^53 - 1"),
    ({"hardware": {"accelerator": "cpu", "memoryBandwidth": 1e-300}}, "spec.hardware.memoryBandwidth",
     "greater than or equal to 1000000000"),
    ({"hardware": {"accelerator": "cpu", "peakFlops": 5.0}}, "spec.hardware.peakFlops", "greater than or equal"),
    ({"hardware": {"accelerator": "cpu", "memory": 1e300}}, "spec.hardware.memory", "less than or equal"),
    ({"hardware": {"accelerator": "cpu", "interconnectBandwidth": 1e-9}}, "spec.hardware.interconnectBandwidth",
     "greater than or equal"),
    ({"target": {"expectedSamples": 1e300}}, "spec.target.expectedSamples", "less than or equal"),
    (_pod("rollout", labels={"team": "a b"}), "spec.rollout.pod.labels.team", "string should match pattern"),
    (_pod("rollout", labels={"team": "x" * 64}), "spec.rollout.pod.labels.team", "at most 63"),
    (_pod("learner", labels={"bad key": "x"}), "spec.learner.pod.labels", "not a valid label or annotation key"),
    (_pod("learner", labels={"a" * 254 + "/b": "x"}), "spec.learner.pod.labels", "not a valid label"),
    (_pod("learner", labels={"rlscale.dev/run": "other"}), "spec.learner.pod.labels", "reserved"),
    (_pod("rollout", annotations={"node.kubernetes.io/x": "y"}), "spec.rollout.pod.annotations", "reserved"),
    (_pod("rollout", annotations={"scheduling.x-k8s.io/pod-group": "other"}), "spec.rollout.pod.annotations",
     "reserved"),
    (_pod("rollout", annotations={"a": "x" * 5000}), "spec.rollout.pod.annotations.a", "at most 4096"),
    (_pod("rollout", priorityClassName="System_Critical"), "spec.rollout.pod.priorityClassName", "pattern"),
    (_pod("rollout", runtimeClassName="a..b"), "spec.rollout.pod.runtimeClassName", "pattern"),
    (_pod("learner", imagePullSecrets=["Reg Cred"]), "spec.learner.pod.imagePullSecrets[0]", "pattern"),
    ({"scheduling": {"schedulerName": "-x"}}, "spec.scheduling.schedulerName", "pattern"),
    ({"scheduling": {"queueName": "team.a"}}, "spec.scheduling.queueName", "pattern"),
    ({"scheduling": {"placementProfile": "h100.pool"}}, "spec.scheduling.placementProfile", "pattern"),
    ({"scheduling": {"placementProfile": "p" * 64}}, "spec.scheduling.placementProfile", "at most 63"),
    (_pod("learner", volumes=[{"name": "s", "secret": {"secretName": "Not/A/Name"}}]),
     "spec.learner.pod.volumes[0].secret.secretName", "not a valid Secret name"),
    (_pod("rollout", env=[{"name": "A", "valueFrom": {"secretKeyRef": {"name": "a_b", "key": "k"}}}]),
     "spec.rollout.pod.env[0].valueFrom.secretKeyRef.name", "not a valid Secret name"),
    (_mount("/etc/rlscale/."), "spec.learner.pod.volumeMounts[0].mountPath", "normal form"),
    (_mount("/models/../etc/rlscale"), "spec.learner.pod.volumeMounts[0].mountPath", "normal form"),
    (_mount("/data//x"), "spec.learner.pod.volumeMounts[0].mountPath", "normal form"),
    (_mount("data"), "spec.learner.pod.volumeMounts[0].mountPath", "not an absolute path"),
    (_mount("/"), "spec.learner.pod.volumeMounts[0].mountPath", "normal form"),
    (_mount("/etc/rlscale/config.json"), "spec.learner.pod.volumeMounts[0].mountPath", "at or under /etc/rlscale"),
    (_mount("/data", mountPropagation="Bidirectional"), "spec.learner.pod.volumeMounts[0].mountPropagation",
     "not a known field"),
    (_mount("/data", subPath="../../x"), "spec.learner.pod.volumeMounts[0].subPath", "'..'"),
    ({"checkpoint": {"path": "./ckpt"}}, "spec.checkpoint.path", "not an absolute path"),
    ({"checkpoint": {"path": "/checkpoints/../etc"}}, "spec.checkpoint.path", "normal form"),
    ({"checkpoint": {"path": "/etc/rlscale"}}, "spec.checkpoint.path", "at or under /etc"),
    ({"checkpoint": {"path": "/models/ckpt"}}, "spec.checkpoint.path", "at or under /models"),
    ({"checkpoint": {"path": "/proc/self"}}, "spec.checkpoint.path", "at or under /proc"),
    (_pod("learner", env=[{"name": "BIG", "value": "x" * 40000}]), "spec.learner.pod.env[0].value", "at most 32768"),
    (_pod("learner", env=[{"name": f"V{i}", "value": "x" * 30000} for i in range(3)]), "spec.learner.pod.env",
     "larger than 65536"),
    ({"task": {"reward": "format", "formatPattern": "(["}}, "spec.task.formatPattern", "Python can compile"),
    ({"task": {"reward": "exact-match\n"}}, "spec.task.reward", "not a reward expression"),
]

# Devices only through gpusPerReplica (issue 42, item 1): no env of the NVIDIA container toolkit, no extended
# resource, no dynamic resource claim, no claim cloned from another's data, and a bound per pod.
DEVICES = [
    (_pod("rollout", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]), "spec.rollout.pod.env[0].name",
     "NVIDIA container toolkit"),
    (_pod("learner", env=[{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}]), "spec.learner.pod.env[0].name",
     "gpusPerReplica"),
    (_pod("learner", env=[{"name": "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "value": "0"}]),
     "spec.learner.pod.env[0].name", "set by the operator"),
    ({"rollout": {"resources": {"limits": {"nvidia.com/gpu": 8}, "requests": {"nvidia.com/gpu": 8}}}},
     "spec.rollout.resources.limits['nvidia.com/gpu']", "gpusPerReplica"),
    ({"learner": {"resources": {"limits": {"amd.com/gpu": 1}}}}, "spec.learner.resources.limits['amd.com/gpu']",
     "gpusPerReplica"),
    ({"learner": {"resources": {"claims": [{"name": "gpus"}]}}}, "spec.learner.resources.claims", "only requests"),
    ({"learner": {"gpusPerReplica": MAX_GPUS_PER_POD + 1}}, "spec.learner.gpusPerReplica",
     f"less than or equal to {MAX_GPUS_PER_POD}"),
    (_pod("learner", volumes=[{"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {"dataSourceRef": {
        "kind": "PersistentVolumeClaim", "name": "other-teams-data"}}}}}]),
     "spec.learner.pod.volumes[0].ephemeral.volumeClaimTemplate.spec.dataSourceRef", "clone"),
    ({"model": {"volume": {"ephemeral": {"volumeClaimTemplate": {"spec": {"dataSource": {"kind": "VolumeSnapshot",
                                                                                          "name": "s"}}}}}}},
     "spec.model.volume.ephemeral.volumeClaimTemplate.spec.dataSource", "clone"),
]


@pytest.mark.parametrize("spec,field,word", DEVICES, ids=[d[1] for d in DEVICES])
def test_devices_come_through_gpus_per_replica_alone(spec, field, word):
    errs = errors_of(spec)
    hit = [e for e in errs if e.startswith((field + ":", field + "[", field + "."))]
    assert hit, errs
    assert word in hit[0], hit[0]


def test_ordinary_resources_still_validate():
    s = parse_spec({**CPU, "learner": {"resources": {"requests": {"cpu": "8", "memory": "64Gi",
                                                                  "ephemeral-storage": "10Gi"},
                                                     "limits": {"hugepages-2Mi": "1Gi", "memory": "64Gi"}}}})
    assert s.learner.resources["limits"]["hugepages-2Mi"] == "1Gi"


@pytest.mark.parametrize("spec,field,word", MALFORMED, ids=[f"{m[1]}-{i}" for i, m in enumerate(MALFORMED)])
def test_malformed_input_is_refused_naming_the_field(spec, field, word):
    errs = errors_of(spec)
    hit = [e for e in errs if e.startswith((field + ":", field + "[", field + "."))]
    assert hit, errs
    assert word in hit[0], hit[0]


WELL_FORMED = [
    _pod("learner", labels={"team": "nlp", "example.com/cost-center": "a-1", "empty": ""},
         annotations={"example.com/owner": "x" * 4096}, nodeSelector={"nvidia.com/gpu.product": "H100"}),
    _mount("/data/cache", subPath="models/qwen", readOnly=True),
    _mount("/tmpdata"),  # shares a prefix with /tmp, but is not under it
    {"checkpoint": {"path": "/mnt/ckpt"}},
    _pod("rollout", priorityClassName="team-a.high", runtimeClassName="nvidia", imagePullSecrets=["reg.cred"]),
    {"scheduling": {"queueName": "team-a", "schedulerName": "volcano", "placementProfile": "h100-" + "p" * 58}},
    _pod("learner", env=[{"name": f"V{i}", "value": "x" * 20000} for i in range(3)]),
    {"hardware": {"accelerator": "cpu", "memoryBandwidth": 5e10, "peakFlops": 2e12, "memory": 6.4e10,
                  "interconnectBandwidth": 1e9}},
    {"task": {"reward": "format", "formatPattern": "^(yes|no)$"}},
]


@pytest.mark.parametrize("spec", WELL_FORMED)
def test_well_formed_input_validates(spec):
    parse_spec({**CPU, **spec})


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    from rlscale.spec import MAX_YAML_ALIASES, load_rlrun

    levels = "\n".join(f"      l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 9))
    p = tmp_path / "bomb.yaml"
    p.write_text("apiVersion: rlscale.dev/v1alpha1\nkind: RLRun\nmetadata: {name: bomb}\nspec:\n"
                 "  hardware: {accelerator: cpu}\n  rollout:\n    resources:\n      l0: &l0 [x, x]\n" + levels + "\n")
    with pytest.raises(SpecError) as info:
        load_rlrun(p)
    assert f"more than {MAX_YAML_ALIASES} aliases" in str(info.value)
    # A few aliases (one tolerations block shared by both roles) still load.
    ok = tmp_path / "ok.yaml"
    ok.write_text("apiVersion: rlscale.dev/v1alpha1\nkind: RLRun\nmetadata: {name: ok}\nspec:\n"
                  "  hardware: {accelerator: cpu}\n  rollout: {pod: {tolerations: &t [{key: a, operator: Exists}]}}\n"
                  "  learner: {pod: {tolerations: *t}}\n")
    assert load_rlrun(ok).spec.learner.pod.tolerations == [{"key": "a", "operator": "Exists"}]


def test_the_crd_carries_the_same_bounds():
    from rlscale.spec.syntax import (
        BANDWIDTH_MIN,
        DNS_SUBDOMAIN_RE,
        ENV_VALUE_MAX,
        FLOPS_MIN,
        INT_MAX,
        LABEL_VALUE_RE,
        MAX_POD_LABELS,
    )

    s = _spec_schema()["properties"]
    assert s["budget"]["properties"]["maxSamples"]["maximum"] == INT_MAX
    assert s["budget"]["properties"]["gpus"]["maximum"] == INT_MAX
    hw = s["hardware"]["properties"]
    assert hw["memoryBandwidth"]["minimum"] == BANDWIDTH_MIN and hw["peakFlops"]["minimum"] == FLOPS_MIN
    pod = s["learner"]["properties"]["pod"]["properties"]
    assert pod["priorityClassName"]["pattern"] == DNS_SUBDOMAIN_RE
    assert pod["imagePullSecrets"]["items"]["pattern"] == DNS_SUBDOMAIN_RE
    assert pod["labels"]["additionalProperties"]["pattern"] == LABEL_VALUE_RE
    assert pod["labels"]["maxProperties"] == MAX_POD_LABELS
    assert pod["env"]["items"]["properties"]["value"]["maxLength"] == ENV_VALUE_MAX
    mount = pod["volumeMounts"]["items"]
    assert set(mount["properties"]) == {"name", "mountPath", "readOnly", "subPath"}
    assert "x-kubernetes-preserve-unknown-fields" not in mount


def test_every_input_rule_has_cel_that_matches_whole_strings():
    """The same regexes in CEL as in Python: every `matches` pattern is anchored at both ends, or is one of
    the segment searches Python runs with re.search too."""
    import re

    from rlscale.spec.rules import RULES
    from rlscale.spec.syntax import DOT_SEGMENT_RE

    for r in RULES:
        for pattern in re.findall(r"matches\('([^']*)'\)", r.cel):
            assert (pattern.startswith("^") and pattern.endswith("$")) or pattern in (
                DOT_SEGMENT_RE, "(^|/)[.][.](/|$)"), (r.path, pattern)


@pytest.mark.parametrize("field,value", [("memoryBandwidth", 1e9), ("peakFlops", 1e9), ("memory", float(2**28)),
                                         ("interconnectBandwidth", 1e6), ("memoryBandwidth", 1e15),
                                         ("peakFlops", 1e18)])
def test_hardware_at_its_bounds_plans_or_says_why(field, value):
    """What validates must run: at the edge of the plausible ranges the planner returns a finite plan or
    a PlanError naming the field to change, never ZeroDivisionError or infinity."""
    import math

    from rlscale.plan import PlanError, make_plan

    spec = parse_spec({**GPU, "hardware": {"accelerator": "H100", field: value}})
    try:
        plan = make_plan(spec).to_dict()
    except PlanError as exc:
        assert "spec." in str(exc)
        return

    def finite(x):
        return (math.isfinite(x) if isinstance(x, float) else all(map(finite, x.values())) if isinstance(x, dict)
                else all(map(finite, x)) if isinstance(x, list) else True)
    assert finite(plan), plan


def test_the_crd_declares_resources_closed_so_cel_reads_their_names():
    for role in ("rollout", "learner"):
        r = _spec_schema()["properties"][role]["properties"]["resources"]
        assert set(r["properties"]) == {"requests", "limits"} and "x-kubernetes-preserve-unknown-fields" not in r
