"""spec.optimizer's lr-schedule rules (checked in Python and emitted as CEL, like rules.py's): a linear or cosine
decay needs room after the warm-up, and decaySteps needs a decay (trainer/lr_schedule.py)."""

from __future__ import annotations

from rlscale.spec.models import RLRunSpec
from rlscale.spec.rule_base import Rule, _err


def _rule_decay_after_warmup(s: RLRunSpec):
    o = s.optimizer
    decay = o.decay_steps or s.budget.max_steps
    if o.lr_schedule != "constant" and decay <= o.warmup_steps:
        unset = "" if o.decay_steps else "(unset: budget.maxSteps) "
        return _err("optimizer.decaySteps", decay, f"{unset}is not above optimizer.warmupSteps ({o.warmup_steps}): "
                    f"lrSchedule {o.lr_schedule} would have nothing to decay",
                    f"set decaySteps above {o.warmup_steps}, lower warmupSteps, or use lrSchedule constant")


def _rule_decay_needs_schedule(s: RLRunSpec):
    o = s.optimizer
    if o.lr_schedule == "constant" and o.decay_steps is not None:
        return _err("optimizer.decaySteps", o.decay_steps, "is set with lrSchedule constant, where nothing decays",
                    "set optimizer.lrSchedule: linear or cosine, or drop decaySteps")


def optimizer_rules() -> list[Rule]:
    """The lr schedule's rules, in rules.py's RULES."""
    return [
        Rule("optimizer.decaySteps", "self.optimizer.lrSchedule == 'constant' || (has(self.optimizer.decaySteps) ? "
             "self.optimizer.decaySteps : self.budget.maxSteps) > self.optimizer.warmupSteps",
             "optimizer.decaySteps (unset: budget.maxSteps) must exceed optimizer.warmupSteps with lrSchedule "
             "linear or cosine", _rule_decay_after_warmup),
        Rule("optimizer.decaySteps", "self.optimizer.lrSchedule != 'constant' || !has(self.optimizer.decaySteps)",
             "optimizer.decaySteps needs lrSchedule linear or cosine", _rule_decay_needs_schedule),
    ]
