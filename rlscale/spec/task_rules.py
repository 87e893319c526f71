"""spec.task's reward-model rules (checked in Python and emitted as CEL, like rules.py's): the reward-model term and
task.rewardModel come together, and a reward model runs only where the code carries it out (CPU replicas)."""

from __future__ import annotations

from rlscale.spec.models import REWARD_MODEL_TERM, RLRunSpec
from rlscale.spec.rule_base import Rule, _err

# Plug-in names hold no hyphen (module:function), so the term is the only way the text can appear in a
# reward expression that passed task.reward's own rule.
_HAS_TERM = f"self.task.reward.contains('{REWARD_MODEL_TERM}')"


def _rule_term_needs_model(s: RLRunSpec):
    t = s.task
    if REWARD_MODEL_TERM in t.reward and t.reward_model is None:
        return _err("task.reward", t.reward, f"has a {REWARD_MODEL_TERM} term, but task.rewardModel is unset",
                    "set task.rewardModel: {path: <a sequence-classification model directory or cached hub id>}, "
                    f"or drop the {REWARD_MODEL_TERM} term")


def _rule_model_needs_term(s: RLRunSpec):
    t = s.task
    if t.reward_model is not None and REWARD_MODEL_TERM not in t.reward:
        return _err("task.rewardModel", t.reward_model.model_dump(mode="json", by_alias=True, exclude_none=True),
                    f"is set, but task.reward {t.reward!r} has no {REWARD_MODEL_TERM} term, so nothing would use it",
                    f"add the term (e.g. reward: 0.5*{REWARD_MODEL_TERM} + 0.5*exact-match, or reward: "
                    f"{REWARD_MODEL_TERM}), or remove task.rewardModel")


def _rule_model_on_cpu(s: RLRunSpec):
    accel = s.hardware.accelerator
    if s.task.reward_model is not None and accel != "cpu":
        return _err("task.rewardModel", s.task.reward_model.path,
                    f"is not carried out on accelerator {accel} yet: its replicas would need GPUs of their own "
                    "(task.rewardModel.gpusPerReplica >= 1), which no rollout or learner pod offers",
                    "score with verifiers or a plug-in on GPU accelerators, or run the reward model with "
                    "hardware.accelerator: cpu (docs/rewards.md)")


def _rule_model_gpus(s: RLRunSpec):
    rm = s.task.reward_model
    if rm is not None and rm.gpus_per_replica != 0:
        return _err("task.rewardModel.gpusPerReplica", rm.gpus_per_replica,
                    "asks for GPU replicas, which are not carried out yet (the replicas run on the driver's node, on "
                    "CPUs)", "remove gpusPerReplica (0: CPU replicas)")


def task_rules() -> list[Rule]:
    """The reward model's rules: a term without a model, a model without its term, GPU replicas."""
    return [
        Rule("task.reward", f"!{_HAS_TERM} || has(self.task.rewardModel)",
             f"task.reward's {REWARD_MODEL_TERM} term needs task.rewardModel", _rule_term_needs_model),
        Rule("task.rewardModel", f"!has(self.task.rewardModel) || {_HAS_TERM}",
             f"task.rewardModel needs a {REWARD_MODEL_TERM} term in task.reward", _rule_model_needs_term),
        Rule("task.rewardModel", "!has(self.task.rewardModel) || self.hardware.accelerator == 'cpu'",
             "task.rewardModel is carried out only on hardware.accelerator cpu (CPU replicas) yet",
             _rule_model_on_cpu),
        Rule("task.rewardModel.gpusPerReplica",
             "!has(self.task.rewardModel) || self.task.rewardModel.gpusPerReplica == 0",
             "task.rewardModel.gpusPerReplica must be 0: GPU replicas of the reward model are not carried out yet",
             _rule_model_gpus),
    ]
