"""rollout.topK, minP and repetitionPenalty: validated with the field named, sent to the rollout only when set
to something else than their no-op value, bounded in the CRD."""

from __future__ import annotations

import pytest
import yaml

from rlscale.spec import SpecError, parse_spec
from tests.conftest import ROOT


def rollout(**knobs):
    return parse_spec({"hardware": {"accelerator": "cpu"}, "rollout": knobs}).rollout


def test_set_knobs_are_sent_and_no_op_ones_are_not():
    assert rollout(topK=50, minP=0.05, repetitionPenalty=1.1, temperature=0.7).sampling() == {
        "temperature": 0.7, "top_p": 1.0, "top_k": 50, "min_p": 0.05, "repetition_penalty": 1.1}
    # TRL's 0 and verl's -1 both mean every token; minP 0 and repetitionPenalty 1 change nothing.
    for off in ({}, {"topK": 0}, {"topK": -1}, {"minP": 0}, {"repetitionPenalty": 1}):
        assert rollout(**off).sampling() == {"temperature": 1.0, "top_p": 1.0}, off


@pytest.mark.parametrize(("knobs", "message"), [
    ({"topK": -2}, "spec.rollout.topK: -2 must be greater than or equal to -1"),
    ({"minP": 1.5}, "spec.rollout.minP: 1.5 must be less than or equal to 1"),
    ({"repetitionPenalty": 0}, "spec.rollout.repetitionPenalty: 0 must be greater than 0"),
    ({"topK": 2.5}, "spec.rollout.topK: 2.5"),
])
def test_out_of_range_knobs_name_the_field(knobs, message):
    with pytest.raises(SpecError) as info:
        rollout(**knobs)
    assert any(str(e).startswith(message) for e in info.value.errors), [str(e) for e in info.value.errors]


def test_the_crd_bounds_them_as_the_spec_does():
    crd = yaml.safe_load((ROOT / "charts/rlscale/crds/rlruns.rlscale.dev.yaml").read_text())
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    knobs = props["rollout"]["properties"]
    assert (knobs["topK"]["type"], knobs["topK"]["minimum"]) == ("integer", -1)
    assert (knobs["minP"]["minimum"], knobs["minP"]["maximum"]) == (0, 1)
    penalty = knobs["repetitionPenalty"]
    assert (penalty["minimum"], penalty["exclusiveMinimum"], penalty["maximum"]) == (0, True, 10)

