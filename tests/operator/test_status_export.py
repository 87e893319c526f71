"""spec.export.hf on Kubernetes: the driver's last progress report names the Hugging Face export (or why
it failed); the operator carries it to status.progress.export and into the outcome condition's message."""

from __future__ import annotations

import json

import yaml

from rlscale.operator import constants as C
from rlscale.operator import status as S
from rlscale.operator.observed import Observed
from rlscale.progress_report import ProgressReport
from rlscale.records import StepRecord
from rlscale.roles import Outcome
from rlscale.spec import parse_spec
from tests.conftest import EXAMPLES

REC = StepRecord(step=40, samples=5120, reward_mean=0.5, samples_per_second=130.0, wall_seconds=39.0,
                 target_metric=0.81, time_to_target_seconds=39.0, samples_to_target=5120)


def _status(export: dict, outcome: Outcome = Outcome.SUCCEEDED) -> dict:
    """compute_status of one pass that read the driver's last report, sent as the driver's KubeSink sends it."""
    sent = ProgressReport.from_record(REC, target_reached=outcome is Outcome.SUCCEEDED, outcome=outcome,
                                      report="/checkpoints/report on q-learner-0", export=export)
    raw = sent.to_json()
    report, error = S.parse_progress(raw)
    assert error is None
    spec = parse_spec(yaml.safe_load((EXAMPLES / "quickstart-k8s.yaml").read_text())["spec"])
    rl = {"metadata": {"generation": 2, "annotations": {C.ANNOTATION_PROGRESS: raw}},
          "status": {"plan": {"prompts": 16, "samplesPerPrompt": 8}}}
    return S.compute_status(Observed(rl, "progress", [], {}, spec=spec, report=report), now="t")


def test_the_export_reaches_status_progress_and_the_succeeded_message():
    export = {"path": "/checkpoints/export/hf", "pod": "q-learner-0", "step": 40, "seconds": 3.2}
    st = _status(export)
    assert st["progress"]["export"] == export
    done = {c["type"]: c for c in st["conditions"]}[C.COND_SUCCEEDED]
    assert done["status"] == "True" and st["phase"] == C.PHASE_SUCCEEDED
    assert "report in /checkpoints/report on q-learner-0; exported to /checkpoints/export/hf on q-learner-0 " \
           "(step 40); workloads scaled to zero" in done["message"]


def test_a_failed_export_is_named_and_the_run_still_ends_with_its_outcome():
    export = {"path": "/checkpoints/export/hf", "pod": "q-learner-0", "step": 40,
              "error": "OSError: [Errno 28] No space left on device"}
    st = _status(export, Outcome.BUDGET_EXHAUSTED)
    assert st["progress"]["export"]["error"].endswith("No space left on device")
    spent = {c["type"]: c for c in st["conditions"]}[C.COND_BUDGET_EXHAUSTED]
    assert spent["status"] == "True" and st["phase"] == C.PHASE_BUDGET_EXHAUSTED
    assert "the export to /checkpoints/export/hf on q-learner-0 failed: OSError" in spent["message"]


def test_a_report_without_an_export_says_nothing_of_one():
    sent = ProgressReport.from_record(REC, target_reached=True, outcome=Outcome.SUCCEEDED)
    assert "export" not in json.loads(sent.to_json())
    conds = S.outcome_conditions([], sent.to_wire(), "eval/accuracy", 0.8, 1)
    assert "export" not in conds[0]["message"]
    # A malformed export from some other writer is dropped, not folded into status.
    report, _ = S.parse_progress(json.dumps({"step": 3, "export": "somewhere"}))
    assert "export" not in report
