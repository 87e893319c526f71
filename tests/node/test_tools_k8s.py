"""The builtin tool task on the real node, through the operator: examples/tools-quickstart.yaml (multi-turn
GRPO with a calculator) applied as an RLRun, its pods (the Ray head, a vLLM rollout pod, a DeepSpeed learner
pod whose driver runs the turns, and a tool pod the driver calls over HTTP: task.toolSandbox.isolation pod,
under the node's default runtime, as no gVisor or Kata is installed here) train builtin:tiny-tools from its
shipped warm start, and the run's records on the checkpoint claim show the held-out accuracy rising clearly
over the warm start and the tool calls per trajectory rising.

Frugal: the local run of the same spec (docs/tools.md) evaluated 0.835 at step 5 (0.010 before training),
its calls per trajectory going 0.08 -> 0.71 over those 5 steps; so one eval every 5 steps with a window of
1 ends the run Succeeded at step 5 when it learns as fast as it did there, and the budget stops it at 10
otherwise."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from rlscale.operator import builders as B
from rlscale.operator import constants as C
from tests.node.runs import RunFacts, RunView, applied_run

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples/tools-quickstart.yaml"
NS, RUN = "tools-e2e", "tools-quickstart"
EVAL_EVERY, MAX_STEPS = 5, 10


def tools_run() -> dict:
    """examples/tools-quickstart.yaml as the other node tests adapt their specs: the claims of the
    README's cluster path (the model built once into rlscale-models, the report on rlscale-checkpoints),
    small resource requests so the pods fit the 2-core node, the roles on pods of their own as the local
    run had them, the calculator in a tool pod, and the bounded budget of the module docstring."""
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["metadata"] = {"name": RUN}
    spec = obj["spec"]
    spec["placement"] = "disaggregated"
    spec["model"]["volume"] = {"persistentVolumeClaim": {"claimName": "rlscale-models"}}
    spec["checkpoint"].update(path="/checkpoints", volume={"persistentVolumeClaim": {"claimName":
                                                                                   "rlscale-checkpoints"}})
    spec["target"].update(evalEvery=EVAL_EVERY, window=1)
    spec["task"]["toolSandbox"] = {"isolation": "pod"}
    spec["budget"]["maxSteps"] = MAX_STEPS
    for role in ("rollout", "learner"):
        spec[role]["resources"] = {"requests": {"cpu": "250m", "memory": "2Gi"}}
    return obj


@dataclass
class ToolsRun(RunFacts):
    tool_pods: set[str] = field(default_factory=set)  # tool pods seen Running
    tool_log: str = ""  # a tool pod's log


@pytest.fixture(scope="module")
def tools(node_cluster, images, tmp_path_factory) -> Iterator[ToolsRun]:
    kubectl, facts = node_cluster.kubectl, ToolsRun()
    pod = f"{B.names(RUN)[C.ROLE_LEARNER]}-0"
    view = RunView(kubectl, NS, RUN)

    def read_logs() -> None:
        out = kubectl("logs", pod, "-c", C.ROLE_LEARNER, "-n", NS, check=False)
        if out.returncode == 0:
            facts.learner_log = out.stdout  # read while the pod lives: the log goes with it
        for p in view.running(C.ROLE_TOOLS):
            facts.tool_pods.add(p["metadata"]["name"])
            out = kubectl("logs", p["metadata"]["name"], "-n", NS, check=False)
            facts.tool_log = out.stdout if out.returncode == 0 else facts.tool_log
    with applied_run(node_cluster, NS, tools_run(), tmp_path_factory.mktemp("tools-checkpoints"), read_logs) as (
            run, seconds):
        facts.seconds, facts.status, facts.records = seconds, run.status(), run.logged()
        yield facts


def evals(records: list[dict]) -> list[tuple[int, float]]:
    return [(r["step"], r["eval_accuracy"]) for r in records if r.get("eval_accuracy") is not None]


def test_the_tool_run_ends_at_its_target_or_its_step_budget(tools):
    st = tools.status
    assert st.get("phase") in (C.PHASE_SUCCEEDED, C.PHASE_BUDGET_EXHAUSTED), (
        json.dumps(st, indent=1) + "\n" + tools.learner_log[-3000:])
    steps = [r["step"] for r in tools.records]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= EVAL_EVERY, steps
    print(f"\n{RUN}: {st['phase']} at step {steps[-1]}, {tools.seconds:.0f} s from apply to the end; evals "
          f"{evals(tools.records)}", file=sys.stderr)


def test_held_out_accuracy_rose_clearly_over_the_warm_start(tools):
    recs = tools.records
    assert recs, tools.learner_log[-3000:]
    start = recs[0]["eval_at_start"]["eval/accuracy"]  # the warm start, greedy, before the first step
    best = max(acc for _, acc in evals(recs))
    # The warm start answers directly and is wrong (0.010 in the local run); a model that learnt to call
    # scores near its copying accuracy (0.835 there). Half of that rise is "clearly".
    assert start < 0.2 and best >= start + 0.4, (start, evals(recs))


def test_tool_calls_per_trajectory_rose(tools):
    calls = [r["tools"]["calls_per_trajectory"] for r in tools.records]
    assert len(calls) >= EVAL_EVERY, calls
    first, last = calls[0], max(calls[-2:])
    # 0.08 at step 1 and 0.71 at step 5 locally: the calls at least doubled and rose by 0.3 per trajectory.
    assert last >= 2 * first and last >= first + 0.3, calls
    assert sum(r["tools"]["calls"] for r in tools.records) > 0


def test_the_driver_called_the_calculator_in_the_tool_pod(tools):
    assert tools.tool_pods, "no tool pod was seen Running"
    assert "tool server on :8700: tools calculator" in tools.tool_log, tools.tool_log[-2000:]
    url = f"http://{B.names(RUN)[C.ROLE_TOOLS]}.{NS}.svc:8700"
    assert f"tools calculator in the tool pods at {url}" in tools.learner_log, tools.learner_log[-3000:]
    print(f"\ntool pod: {[x for x in tools.tool_log.splitlines() if 'tool server' in x][-1:]}", file=sys.stderr)
