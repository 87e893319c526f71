"""The committed CRD is the one generated from the spec, and it reads well in `kubectl explain`."""

from __future__ import annotations

import yaml

from rlscale.crd import PRINTER_COLUMNS, crd, crd_yaml
from rlscale.spec.rules import RULES
from tests.conftest import ROOT

CRD_FILE = ROOT / "charts/rlscale/crds/rlruns.rlscale.dev.yaml"


def test_committed_crd_matches_generated():
    assert CRD_FILE.read_text() == crd_yaml(), "the CRD is stale: run `make crd` and commit the result"


def _walk(schema: dict, path: str = "spec"):
    for key, sub in schema.get("properties", {}).items():
        yield f"{path}.{key}", sub
        yield from _walk(sub, f"{path}.{key}")


def test_every_spec_field_has_a_description():
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    missing = [p for p, s in _walk(spec) if not s.get("description")]
    assert not missing, missing


def test_cross_field_rules_are_cel_with_field_paths():
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = spec["x-kubernetes-validations"]
    assert len(rules) == len(RULES)
    props = dict(_walk(spec))
    for r in rules:
        assert r["rule"] and r["message"]
        assert "spec" + r["fieldPath"] in props, r["fieldPath"]


def test_nested_blocks_default_to_empty_so_cel_sees_defaults():
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for key in ("batch", "algorithm", "task", "rollout", "learner", "hardware", "budget", "optimizer"):
        assert spec["properties"][key]["default"] == {}
    assert spec["properties"]["batch"]["properties"]["samplesPerPrompt"]["default"] == 8


def test_status_subresource_and_printer_columns():
    v = crd()["spec"]["versions"][0]
    assert v["subresources"] == {"status": {}}
    names = [c["name"] for c in v["additionalPrinterColumns"]]
    assert names == [c["name"] for c in PRINTER_COLUMNS]
    assert {"Phase", "Batch", "LR", "Rollout", "Learner", "Reward", "Target-Time", "Age"} <= set(names)


def test_crd_is_plain_yaml():
    doc = yaml.safe_load(CRD_FILE.read_text())
    assert doc["metadata"]["name"] == "rlruns.rlscale.dev"


def test_readme_spec_reference_is_generated():
    from rlscale.crd import spec_reference_markdown

    text = (ROOT / "README.md").read_text()
    start, end = "<!-- spec-reference:start -->\n", "<!-- spec-reference:end -->"
    assert start in text and end in text
    table = text.split(start, 1)[1].split(end, 1)[0]
    assert table == spec_reference_markdown(), \
        "README's spec table is stale: regenerate it from rlscale.crd.spec_reference_markdown()"
