"""spec.lora's cross-field rules (checked in Python and emitted as CEL, like rules.py's)."""

from __future__ import annotations

from rlscale.spec.lora import ALL_LINEAR, VLLM_RANKS
from rlscale.spec.rule_base import Rule, _err


def _rule_all_linear(s):
    lo = s.lora
    if lo is not None and lo.all_linear and len(lo.target_modules) > 1:
        return _err("lora.targetModules", lo.target_modules, "mixes all-linear with module names",
                    "use all-linear alone, or list the modules")


def _rule_rank(s):
    lo = s.lora
    if lo is not None and lo.rank not in VLLM_RANKS:
        return _err("lora.rank", lo.rank, "is not a rank vLLM's LoRA kernels serve",
                    "use one of " + ", ".join(map(str, VLLM_RANKS)))


def _rule_zero3(s):
    if s.lora is not None and s.learner.zero_stage == 3:
        return _err("learner.zeroStage", 3, "partitions the frozen base with the adapter, and the LoRA learner "
                    "merges and sends its weights whole on each rank", "use zeroStage 0-2 with spec.lora (the "
                    "adapter's optimizer states are small; ZeRO-3 would only shard the frozen base)")


def lora_rules() -> list[Rule]:
    ranks = "[" + ", ".join(map(str, VLLM_RANKS)) + "]"
    return [
        Rule("lora.targetModules", f"!has(self.lora) || !('{ALL_LINEAR}' in self.lora.targetModules) || "
             "size(self.lora.targetModules) == 1", "lora.targetModules: all-linear stands alone", _rule_all_linear),
        Rule("lora.rank", f"!has(self.lora) || self.lora.rank in {ranks}",
             "lora.rank must be one of vLLM's LoRA ranks " + ranks, _rule_rank),
        Rule("learner.zeroStage", "!has(self.lora) || self.learner.zeroStage < 3",
             "spec.lora needs learner.zeroStage 0-2", _rule_zero3),
    ]
