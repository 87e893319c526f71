"""Two rules the decision applies beside time-to-target: no budgeted GPU left idle, and the words for the
learner's ZeRO stage and sharding (docs/planner.md, section 3)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rlscale.plan.topology import sharding_text

# Another ZeRO stage is named as the faster choice only when its train + sync is at least this much shorter:
# the collectives are modelled, not measured.
ZERO_MARGIN = 0.05


def using_the_budget(cands: list[Any], budget_gpus: int) -> list[Any]:
    """The candidates the choice may take: those that use every budgeted GPU when any does (a plan with
    budgeted GPUs idle is never chosen over one that runs them all, whatever the model predicts), else those
    that use the most GPUs any candidate can. On cpu (no GPUs) all of them."""
    if not cands or budget_gpus <= 0 or not any(c.gpus for c in cands):
        return cands
    full = [c for c in cands if c.gpus == budget_gpus]
    if full:
        return full
    most = max(c.gpus for c in cands)
    return [c for c in cands if c.gpus == most]


def idle_note(win: Any, budget_gpus: int, spec: Any) -> str | None:
    """A note when the plan cannot use every budgeted GPU: no split of whole pods adds up to the budget."""
    if not win.gpus or win.gpus >= budget_gpus:
        return None
    return (f"{budget_gpus - win.gpus} of budget.gpus ({budget_gpus}) stay idle: no split of learner pods of "
            f"{spec.learner.gpus_per_replica} GPUs and rollout replicas of {spec.rollout.gpus_per_replica} within "
            "the replica bounds adds up to the budget; change gpusPerReplica, the maxReplicas or budget.gpus")


def zero_reason(model: Any, win: Any) -> str:
    """The learner's layout (pods x GPUs, ZeRO stage, over which link) and why that stage: learner.zeroStage
    is what DeepSpeed runs, and when another stage that fits trains and publishes faster at the winner's
    batch (train + sync) by more than ZERO_MARGIN the sentence names it with the field to set."""
    k, world = win.learner_replicas, model._learner_world(win.learner_replicas)
    if model.profile.shared_host:
        return f"{k} learner process(es) x {world // max(1, k)} rank(s) on one cpu host, ZeRO-{model.zero_stage}"
    text = sharding_text(model.zero_stage, world, k, model.learner_gpus, model.node_gpus)
    if world <= 1:
        return text
    own = model.train_seconds(win.batch, k) + model.sync_seconds(win.rollout_replicas, k)
    best = None
    for stage in (0, 1, 2, 3):
        other = replace(model, zero_stage=stage)
        if stage == model.zero_stage or other.learner_infeasible(k):
            continue
        t = other.train_seconds(win.batch, k) + other.sync_seconds(win.rollout_replicas, k)
        if t < own * (1 - ZERO_MARGIN) and (best is None or t < best[1]):
            best = (stage, t)
    link = ("NVLink" if model.learner_nodes(k) == 1 else
            f"the {model.profile.interconnect_bandwidth / 1e9:.0f} GB/s network between pods")
    if best is None:
        return f"{text}: learner.zeroStage; no other stage that fits trains and publishes faster over {link}"
    stage, t = best
    why = ("ZeRO-3 gathers the weights for every pass over every micro-batch" if model.zero_stage == 3 else
           "its collectives and optimizer traffic cost less")
    return (f"{text}: learner.zeroStage; ZeRO-{stage} fits and trains + publishes x{own / t:.2f} faster at N="
            f"{win.batch} ({own:.2f} s vs {t:.2f} s; {why}, over {link}): set learner.zeroStage: {stage}")
