"""The driver's loop around fake rollout and learner: who numbers the weights, what a step hands over,
what its sinks see, how a resume keeps one history, and how plan changes are taken between steps."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlscale.plan import make_plan
from rlscale.progress_report import ProgressReport
from rlscale.roles import RunEnd
from rlscale.rollout.placement import ServingState
from rlscale.spec import load_rlrun
from rlscale.trainer.batching import RolloutBatch
from rlscale.trainer.driver import Driver, Task
from rlscale.trainer.plan_source import FixedPlan, PlanChange
from rlscale.trainer.rewards import resolve_reward
from rlscale.trainer.sinks import KubeSink, RunLog
from rlscale.trainer.tasks import Problem
from tests.conftest import EXAMPLES


class FakeRollout:
    """Replicas on pods t-rollout-0, -1, ...; at most `capacity` of them run (None: all): a scale-up
    past it waits for pods that do not come, as Serve does for `rollout` resources."""

    def __init__(self, reply: str, capacity: int | None = None):
        self.reply, self.published, self.scaled = reply, [], []
        self.target, self.capacity = 1, capacity

    def generate(self, prompt_ids, n, **_):
        sample = SimpleNamespace(token_ids=[ord(c) for c in self.reply], logprobs=[-1.0] * len(self.reply),
                                 finish_reason="stop")
        return [[sample] * n for _ in prompt_ids]

    def publish_weights(self, version, weights):
        self.published.append(version)

    def scale(self, n):
        self.scaled.append(n)
        self.target = n
        return self.serving()

    def serving(self):
        running = self.target if self.capacity is None else min(self.target, self.capacity)
        return ServingState(self.target, {"RUNNING": running, **({"STARTING": self.target - running}
                                                                  if running < self.target else {})},
                            tuple(f"t-rollout-{i}" for i in range(running)))

    def generation_seconds_total(self):
        return 0.0


class FakeLearner:
    """Steps skip when every group scored alike (as the real learner does); checkpoints live in a dict."""

    def __init__(self):
        self.batches, self.saved = [], {}

    def step(self, batch, lr=None):
        self.batches.append(batch)
        skipped = len(set(batch.rewards)) == 1
        return {"skipped": 1.0 if skipped else 0.0, "loss": None if skipped else 0.1}

    def export_weights(self):
        return {}

    def save_checkpoint(self, directory, state=None, keep=2):
        self.saved[state["step"]] = json.loads(json.dumps(state))

    def load_checkpoint(self, directory):
        return self.saved[max(self.saved)] if self.saved else None

    def shutdown(self):
        pass


class CharTokenizer:
    def __call__(self, text):
        return SimpleNamespace(input_ids=[ord(c) for c in text])

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["".join(map(chr, s)) for s in ids]


class Recorder:
    """A sink that keeps what it is given."""

    def __init__(self):
        self.started, self.records, self.plans, self.ended, self.serving = [], [], [], [], []

    def start(self, plan, state, resumed):
        self.started.append((plan.key, resumed))

    def plan_changed(self, plan, at_step, why):
        self.plans.append((plan.key, at_step, why))

    def rollout_changed(self, serving, scaled):
        self.serving.append((serving.target, serving.running, scaled))

    def record(self, rec, history):
        self.records.append(rec)

    def end(self, end, history, target_reached):
        self.ended.append((end, target_reached))


PROBLEMS = [Problem("1+1=", "2"), Problem("2+2=", "4")]


def driver(reply: str, tmp_path: Path, learner: FakeLearner | None = None, plan_source=None, report: bool = False,
           **spec_over) -> Driver:
    rlrun = load_rlrun(EXAMPLES / "quickstart.yaml")
    spec = rlrun.spec.model_copy(deep=True)
    for section, values in spec_over.items():
        setattr(spec, section, getattr(spec, section).model_copy(update=values))
    plan = replace(make_plan(spec), prompts=2)
    run_log = RunLog(tmp_path / "run", spec.target.value, spec.target.metric, "t", report=report)
    return Driver(spec=spec, plan=plan, task=Task(PROBLEMS, PROBLEMS, resolve_reward("exact-match"), 4),
                  tokenizer=CharTokenizer(), learner=learner or FakeLearner(), rollout=FakeRollout(reply),
                  run_log=run_log, sinks=[run_log, Recorder()], plan_source=plan_source or FixedPlan(),
                  ckpt_dir=tmp_path / "ckpt", run_id="ns/t")


def test_a_skipped_step_keeps_the_weights_version_and_publishes_nothing(tmp_path):
    d = driver("7", tmp_path)  # every sample wrong: every group scores alike, the learner skips
    rec = d.step()
    assert rec.skipped is True and rec.weights_version == 0 and d.rollout.published == []
    assert rec.step == 1 and rec.samples == 2 * d.spec.batch.samples_per_prompt


def test_an_applied_step_publishes_the_next_version(tmp_path):
    d = driver("2", tmp_path)  # right on the first prompt, wrong on the second: a signal
    rec = d.step()
    assert rec.skipped is False and rec.weights_version == 1 and d.rollout.published == [1]


def test_the_learner_gets_a_rollout_batch_with_the_samplers_logprobs(tmp_path):
    d = driver("2", tmp_path)
    d.step()
    (batch,) = d.learner.batches
    n = d.spec.batch.samples_per_prompt
    assert isinstance(batch, RolloutBatch) and batch.samples_per_prompt == n and len(batch) == 2 * n
    assert batch.rewards == pytest.approx([1.0] * n + [0.0] * n)
    assert batch.rollout_logprobs == [[-1.0]] * (2 * n)


def test_the_record_carries_the_learners_diagnostics(tmp_path):
    from rlscale.metrics_names import DIAGNOSTIC_KEYS

    d = driver("2", tmp_path)
    values = {"mixed_group_fraction": 0.5, "entropy": 1.25, "clip_fraction": 0.02, "grad_norm": 3.5,
              "logprob_diff": -1e-3, "logprob_abs_diff": 4e-3}
    step = d.learner.step
    d.learner.step = lambda batch, lr=None: {**step(batch, lr), **values}
    rec = d.step()
    assert {k: rec.diagnostic(k) for k in DIAGNOSTIC_KEYS} == values
    d.learner.step = step  # a learner that reports none of them: present, and None
    rec = d.step()
    assert all(rec.diagnostic(k) is None for k in DIAGNOSTIC_KEYS)


def test_a_run_to_its_budget_logs_every_step_and_tells_every_sink(tmp_path, monkeypatch):
    reports = []
    monkeypatch.setattr("rlscale.trainer.sinks.write_report", lambda *a: reports.append(a))  # plots: tests/core
    d = driver("2", tmp_path, report=True, budget={"max_steps": 7}, target={"eval_every": 3}, checkpoint={"every": 5})
    d.resume_or_start()
    assert d.run() == RunEnd.BUDGET
    rec = d.sinks[1]
    assert [r.step for r in rec.records] == list(range(1, 8)) and rec.ended == [(RunEnd.BUDGET, False)]
    assert rec.started == [(d.plan.key, False)]
    logged = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == list(range(1, 8))
    assert logged[0]["eval_at_start"]["eval/accuracy"] == 0.5  # "2" is right for 1+1 only
    assert [r["eval"] is not None for r in logged] == [s % 3 == 0 for s in range(1, 8)]
    assert sorted(d.learner.saved) == [5, 7]  # every 5 steps, and at the end
    assert reports == [(tmp_path / "run", d.spec.target.value, d.spec.target.metric, "t")]  # the log's end


def test_a_resume_redoes_the_steps_after_the_checkpoint_in_one_history(tmp_path):
    learner = FakeLearner()
    d = driver("2", tmp_path, learner, budget={"max_steps": 7}, checkpoint={"every": 5}, target={"eval_every": 0})
    d.resume_or_start()
    for _ in range(7):  # a crash after step 7, before its checkpoint: 5 is the newest
        d.finish_record(d.step())
        if d.state.step == 5:
            d.checkpoint()
    again = driver("2", tmp_path, learner, budget={"max_steps": 9}, checkpoint={"every": 5}, target={"eval_every": 0})
    assert again.resume_or_start() and again.state.step == 5
    assert [r.step for r in again.records] == [1, 2, 3, 4, 5]
    assert again.run() == RunEnd.BUDGET
    logged = [json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    redone = [json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.redone.jsonl").read_text().splitlines()]
    assert logged == list(range(1, 10)) and redone == [6, 7]
    assert again.sinks[1].started == [(again.plan.key, True)]


def test_a_plan_change_scales_the_rollout_and_moves_batch_and_lr_between_steps(tmp_path):
    class SwitchOnce:
        def after_step(self, plan, history):
            if len(history) == 2:
                return PlanChange(replace(plan, prompts=1, rollout_replicas=2, learning_rate=5e-5), "measured faster")
            return None

    d = driver("2", tmp_path, plan_source=SwitchOnce(), budget={"max_steps": 4}, target={"eval_every": 0})
    lr0 = d.plan.learning_rate
    d.resume_or_start()
    d.run()
    recs = d.sinks[1].records
    assert [r.prompts for r in recs] == [2, 2, 1, 1] and [r.lr for r in recs] == [lr0, lr0, 5e-5, 5e-5]
    assert d.rollout.scaled == [2] and [r.rollout_replicas for r in recs] == [1, 1, 2, 2]
    assert d.sinks[1].plans == [((1, 2), 2, "measured faster")]
    plans = json.loads((tmp_path / "run" / "plan.json").read_text())["plans"]
    assert [(p["atStep"], p["prompts"], p.get("why")) for p in plans] == [(0, 2, None), (2, 1, "measured faster")]


def test_a_new_prediction_alone_changes_no_configuration_and_no_plan_json(tmp_path):
    class Repredict:
        def after_step(self, plan, history):
            pred = replace(plan.predicted, step_seconds=0.5)
            return PlanChange(replace(plan, predicted=pred)) if len(history) == 1 else None

    d = driver("2", tmp_path, plan_source=Repredict(), budget={"max_steps": 2}, target={"eval_every": 0})
    d.resume_or_start()
    d.run()
    recs = d.sinks[1].records
    assert recs[1].predicted_step_seconds == 0.5 and d.rollout.scaled == [] and recs[1].prompts == 2
    assert len(json.loads((tmp_path / "run" / "plan.json").read_text())["plans"]) == 1


def test_the_pods_progress_report_carries_what_the_operator_re_plans_from(tmp_path):
    sent = []
    reporter = SimpleNamespace(due=lambda: True, report=lambda body, force=False: sent.append((body, force)))
    d = driver("2", tmp_path, budget={"max_steps": 3}, target={"eval_every": 0})
    d.sinks.append(KubeSink(reporter, "/ckpt/report on t-learner-0"))
    d.resume_or_start()
    d.run()
    bodies = [ProgressReport.from_wire(json.loads(b.to_json())) for b, _ in sent]
    assert [b.step for b in bodies] == [1, 2, 3, 3] and sent[-1][1] is True
    last = bodies[-1]
    assert last.outcome.value == "BudgetExhausted" and last.report.endswith("t-learner-0")
    assert last.measurements["step"] == 3 and last.measurements["calibration"]["prompts"] == 2


def test_a_pods_driver_follows_the_plan_the_operator_writes_even_one_changed_while_it_was_down(tmp_path):
    from rlscale.runconfig import RunConfig
    from rlscale.trainer.plan_source import FollowOperator

    d = driver("2", tmp_path)
    path = tmp_path / "run.json"
    RunConfig(run="t", spec=d.spec, plan=d.plan).save(path)
    follow = FollowOperator(str(path))
    assert follow.after_step(d.plan, []) is None  # the same plan: nothing to do
    moved = replace(d.plan, prompts=4, rollout_replicas=2)
    RunConfig(run="t", spec=d.spec, plan=moved).save(path)
    change = follow.after_step(d.plan, [])
    assert change is not None and change.plan.key == (4, 2) and change.why == "the operator re-planned"
    assert follow.after_step(moved, []) is None  # read once per change of the file
    # A driver that starts (or resumes) after the operator moved the plan takes it at its first step.
    assert FollowOperator(str(path)).after_step(d.plan, []).plan.key == (4, 2)


class Switch:
    """The operator's plan, changed after step `at` to `rollout` replicas."""

    def __init__(self, at: int, rollout: int):
        self.at, self.rollout = at, rollout

    def after_step(self, plan, history):
        if len(history) == self.at:
            return PlanChange(replace(plan, rollout_replicas=self.rollout), "the operator re-planned")
        return None


def reporting(d: Driver) -> list:
    """A KubeSink on the driver whose reports land in the returned list (body, forced)."""
    sent = []
    reporter = SimpleNamespace(due=lambda: True, report=lambda body, force=False: sent.append((body, force)))
    d.sinks.append(KubeSink(reporter, "/ckpt/report on t-learner-0"))
    return sent


def test_a_scale_up_that_does_not_complete_keeps_stepping_at_the_size_that_runs_and_reports_it(tmp_path):
    d = driver("2", tmp_path, plan_source=Switch(at=1, rollout=4), budget={"max_steps": 3}, target={"eval_every": 0})
    d.rollout.capacity = 2  # two pods fit; the other two never get a node
    sent = reporting(d)
    d.resume_or_start()
    assert d.run() == RunEnd.BUDGET  # nothing raised, nothing waited for
    recs = d.sinks[1].records
    assert d.rollout.scaled == [4] and [r.rollout_replicas for r in recs] == [1, 2, 2]
    assert d.sinks[1].serving[:2] == [(1, 1, False), (4, 2, True)]
    bodies = [ProgressReport.from_wire(json.loads(b.to_json())) for b, _ in sent]
    assert [(b.step, b.rollout_target, b.rollout_serving) for b in bodies] == [(1, 1, 1), (1, 4, 2), (2, 4, 2),
                                                                              (3, 4, 2), (3, 4, 2)]
    assert bodies[1].rollout_pods == ["t-rollout-0", "t-rollout-1"] and sent[1][1] is True  # at once
    # The pods come after all: the next steps generate with every replica.
    d.rollout.capacity = None
    d.spec.budget.max_steps = 4
    d.run()
    assert d.sinks[1].records[-1].rollout_replicas == 4


def test_a_scale_down_reports_at_once_which_pods_still_host_a_replica(tmp_path):
    d = driver("2", tmp_path, plan_source=Switch(at=2, rollout=1), budget={"max_steps": 3}, target={"eval_every": 0})
    d.plan, d.state.rollout_replicas, d.rollout.target = replace(d.plan, rollout_replicas=3), 3, 3
    sent = reporting(d)
    d.resume_or_start()
    d.run()
    bodies = [ProgressReport.from_wire(json.loads(b.to_json())) for b, _ in sent]
    # Step 2's report, then the one right after the drain (same step, forced), then step 3's.
    assert [(b.step, b.rollout_target, b.rollout_serving) for b in bodies[:4]] == [(1, 3, 3), (2, 3, 3), (2, 1, 1),
                                                                                  (3, 1, 1)]
    assert bodies[1].rollout_pods == ["t-rollout-0", "t-rollout-1", "t-rollout-2"]
    assert bodies[2].rollout_pods == ["t-rollout-0"] and sent[2][1] is True
    # The drained pods are the ones the report no longer names: the operator may remove those.
    assert set(bodies[1].rollout_pods) - set(bodies[2].rollout_pods) == {"t-rollout-1", "t-rollout-2"}
    assert [r.rollout_replicas for r in d.sinks[1].records] == [3, 3, 1]
