"""LoRA on the real node, through the operator: examples/quickstart-lora.yaml (GRPO training a rank-16
adapter on the frozen builtin model) applied as an RLRun with its roles on pods of their own, so every
weight update crosses from the learner pod to the vLLM rollout pod as the adapter alone (by gloo, as on
one machine) and the rollout pod serves each version through vLLM's LoRA support.

Frugal: four steps and one eval; learning to the target is the local run's to show (docs/lora.md,
"Measured"); here the adapter's path between pods is what is checked."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from rlscale.operator import builders as B
from rlscale.operator import constants as C
from tests.node.runs import RunFacts, applied_run

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples/quickstart-lora.yaml"
# The model the adapter trains on, as it ships (float32 safetensors): what a whole-model update would send.
MODEL_FILE = REPO / "trainer/weights/tiny-arith-v2/model.safetensors"
NS, RUN = "lora-e2e", "quickstart-lora"
STEPS = 4


def lora_run() -> dict:
    """examples/quickstart-lora.yaml with the claims of the README's cluster path, small resource requests
    so the pods fit the 2-core node, one pod per role, and the bounded budget of the module docstring."""
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["metadata"] = {"name": RUN}
    spec = obj["spec"]
    spec["placement"] = "disaggregated"
    spec["model"]["volume"] = {"persistentVolumeClaim": {"claimName": "rlscale-models"}}
    spec["checkpoint"] = {"every": STEPS, "path": "/checkpoints",
                          "volume": {"persistentVolumeClaim": {"claimName": "rlscale-checkpoints"}}}
    spec["target"].update(evalEvery=STEPS, window=1)
    spec["task"]["evalSize"] = 128
    spec["budget"].update(maxSteps=STEPS)
    for role in ("rollout", "learner"):
        spec[role].update(replicas=1)
        spec[role]["resources"] = {"requests": {"cpu": "250m", "memory": "2Gi"}}
    return obj


@pytest.fixture(scope="module")
def lora(node_cluster, images, tmp_path_factory) -> Iterator[RunFacts]:
    kubectl, facts = node_cluster.kubectl, RunFacts()
    pod = f"{B.names(RUN)[C.ROLE_LEARNER]}-0"

    def read_log() -> None:
        out = kubectl("logs", pod, "-c", C.ROLE_LEARNER, "-n", NS, check=False)
        if out.returncode == 0:
            facts.learner_log = out.stdout  # read while the pod lives: the log goes with it
    with applied_run(node_cluster, NS, lora_run(), tmp_path_factory.mktemp("lora-checkpoints"), read_log) as (
            run, seconds):
        facts.seconds, facts.status, facts.records = seconds, run.status(), run.logged()
        yield facts


def test_the_lora_run_trains_its_steps_and_ends(lora):
    st = lora.status
    assert st.get("phase") in (C.PHASE_SUCCEEDED, C.PHASE_BUDGET_EXHAUSTED), (
        json.dumps(st, indent=1) + "\n" + lora.learner_log[-3000:])
    steps = [r["step"] for r in lora.records]
    assert steps == list(range(1, STEPS + 1)), (steps, lora.learner_log[-3000:])
    assert all(r["grad_norm"] > 0 for r in lora.records), [r["grad_norm"] for r in lora.records]
    print(f"\n{RUN}: {st['phase']} at step {steps[-1]}, {lora.seconds:.0f} s from apply to the end",
          file=sys.stderr)


def test_each_update_sent_the_adapter_alone_to_the_rollout_pod(lora):
    sent = re.findall(r"adapter v(\d+) by (\w+) to (\d+) replica", lora.learner_log)
    assert sent, lora.learner_log[-3000:]
    versions = [int(v) for v, _, _ in sent]
    # v0 (the starting adapter, as the engine starts from the base) and one per trained step.
    # (A replica that joins late is sent the current version again: a version may appear twice.)
    assert sorted(set(versions)) == list(range(max(versions) + 1)) and max(versions) >= STEPS - 1, sent
    assert {(how, n) for _, how, n in sent} == {("gloo", "1")}, sent
    sizes = {r["sync_bytes"] for r in lora.records}
    # A rank-16 adapter on every linear layer of a 3.42M-parameter model: 1.25 MiB against 13.7 MB whole
    # (the local run's metrics.jsonl); at most a fifth of the model file.
    assert len(sizes) == 1 and 0 < sizes.pop() < 0.2 * MODEL_FILE.stat().st_size, lora.records[-1]["sync_bytes"]


def test_the_rollout_pod_generated_with_the_learners_adapter(lora):
    # vLLM's log-probs of the sampled tokens against the learner's own under the adapter it trained: the
    # local LoRA quickstart measured 6e-7 over 320 steps; a replica serving another version, or the base,
    # is off by the update's effect on each token.
    diffs = [r["logprob_abs_diff"] for r in lora.records]
    assert all(d < 1e-3 for d in diffs), diffs
    assert [r["eval_accuracy"] for r in lora.records if r.get("eval_accuracy") is not None], lora.records[-1]
