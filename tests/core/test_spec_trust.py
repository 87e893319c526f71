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
