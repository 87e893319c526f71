"""Acceptance of issue 40's planner: `rlscale plan` on the 7B examples for one 8-H100 node and for 2 x 8 H100
with the chart's default images gives a plan those images run, uses every budgeted GPU, and shows the learner
topology, the transfer backend and max_num_seqs."""

from __future__ import annotations

import json

import pytest

from rlscale.plan import make_plan
from rlscale.plan.placement import colocated_unavailable, transfer_backend
from rlscale.spec import load_rlrun
from tests.conftest import EXAMPLES
from tests.conftest import rlscale_cli as cli


@pytest.mark.parametrize(("name", "gpus", "pod_gpus"), [("grpo-7b-h100x8.yaml", 8, 4), ("grpo-7b-h100x16.yaml", 16, 8)])
def test_7b_examples_plan_what_the_default_images_run_on_every_gpu(name, gpus, pod_gpus):
    spec = load_rlrun(EXAMPLES / name).spec
    # the chart's default images: the learner image carries vLLM, so colocated is offered
    assert spec.learner.image is None and spec.rollout.image is None
    assert colocated_unavailable(spec) is None
    # x16: the default topology, one learner pod per node with all its GPUs; x8: pods of 4 (a TP-8 engine
    # cannot shard the 7B's 28 attention heads)
    assert spec.learner.gpus_per_replica == pod_gpus and spec.hardware.node_gpus == 8
    p = make_plan(spec)
    assert p.gpus == spec.budget.gpus == gpus  # no budgeted GPU idle
    assert p.learner_replicas * p.ranks_per_pod <= gpus and p.ranks_per_pod == pod_gpus
    assert spec.learner.gpus_per_replica % p.tensor_parallel == 0 or p.placement == "disaggregated"
    assert 28 % p.tensor_parallel == 0  # vLLM shards the attention heads over the engine's GPUs
    assert p.transfer_backend == transfer_backend("H100", p.placement)
    assert p.max_num_seqs > 0 and p.zero_stage == spec.learner.zero_stage
    assert p.learner_topology.startswith(f"{p.learner_replicas} pod(s) x {pod_gpus} GPUs, ZeRO-{p.zero_stage}")
    where = "inside one pod's NVLink" if p.learner_replicas == 1 else "pods over the network"
    assert where in p.learner_topology
    # no note asks to change the micro-batch: the example's settings fit
    assert not any("microBatchTokens" in n for n in p.notes)

    r = cli("plan", str(EXAMPLES / name))
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stdout.replace("│", " ").split())
    assert f"learner {p.learner_replicas} pod(s) x {pod_gpus} GPUs, ZeRO-{p.zero_stage}" in flat, flat
    assert f"transfer backend {p.transfer_backend}" in flat and f"max_num_seqs {p.max_num_seqs}" in flat
    d = json.loads(cli("plan", str(EXAMPLES / name), "--json").stdout)
    assert (d["gpus"], d["transferBackend"], d["maxNumSeqs"]) == (gpus, p.transfer_backend, p.max_num_seqs)
