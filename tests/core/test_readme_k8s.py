"""The README's Kubernetes block, read the way tests/node/test_quickstart_k8s.py runs it: its files
hold together (the run's namespace enforces a Pod Security profile, as the operator requires, and
holds the claims the run names), so the block as written can reach Succeeded."""

from __future__ import annotations

import yaml

from tests.node.test_quickstart_k8s import EXAMPLE, NS, RUN, VOLUMES, readme_commands


def test_the_block_parses_as_the_end_to_end_test_runs_it():
    run, watch = readme_commands()
    assert run[-1] == f"kubectl apply -f {EXAMPLE.relative_to(EXAMPLE.parents[1])}"
    assert f"-n {NS}" in watch and RUN in watch


def test_the_runs_namespace_enforces_pod_security_and_holds_the_claims_the_run_names():
    docs = list(yaml.safe_load_all(VOLUMES.read_text()))
    ns = [d for d in docs if d["kind"] == "Namespace"]
    assert [d["metadata"]["name"] for d in ns] == [NS]
    assert ns[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    claims = {d["metadata"]["name"] for d in docs
              if d["kind"] == "PersistentVolumeClaim" and d["metadata"]["namespace"] == NS}
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    named = {spec[k]["volume"]["persistentVolumeClaim"]["claimName"] for k in ("model", "checkpoint")}
    assert named <= claims, (named, claims)
    bound = {d["spec"]["claimRef"]["name"] for d in docs
             if d["kind"] == "PersistentVolume" and d["spec"]["claimRef"]["namespace"] == NS}
    assert named <= bound


def test_the_local_values_allow_the_claims_and_pin_the_operator_to_the_real_node():
    from hack import cluster as cp
    from hack.cluster import quickstart as qs

    values = yaml.safe_load(qs.VALUES.read_text())
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    assert {spec[k]["volume"]["persistentVolumeClaim"]["claimName"] for k in ("model", "checkpoint")} <= set(
        values["policy"]["claimNames"])
    assert values["operator"]["nodeSelector"] == {cp.REAL_NODE_LABEL: "real"}
