"""What an RLRun may ask for: counts the planner can enumerate, volume sources from an allowlist,
and no reach into another run's Ray token Secret. Each refusal names the field and the fix."""

from __future__ import annotations

import pytest

from rlscale.crd import crd
from rlscale.spec import MAX_PROMPTS, MAX_REPLICAS, MAX_SAMPLES_PER_PROMPT, SpecError, parse_spec

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

