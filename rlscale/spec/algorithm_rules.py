"""spec.algorithm's cross-field rules (checked in Python and emitted as CEL, like rules.py's): a knob the
chosen algorithm or loop would ignore is refused, so a spec that validates runs as written."""

from __future__ import annotations

from typing import Any

from rlscale.spec.algorithm import (
    DEFAULT_GAMMA,
    DEFAULT_KL_ESTIMATOR,
    DEFAULT_LAMBDA,
    DEFAULT_MAX_ROUNDS,
    DEFAULT_VALUE_CLIP,
    DEFAULT_VALUE_COEF,
    GROUP_ALGORITHMS,
    KL_IN_REWARD,
)
from rlscale.spec.models import MAX_NEW_TOKENS_CEL, RLRunSpec
from rlscale.spec.rule_base import Rule, _cel_list, _err


def _rule_kl_estimator(s: RLRunSpec):
    a = s.algorithm
    if a.kl_estimator == DEFAULT_KL_ESTIMATOR:
        return None
    if a.name in KL_IN_REWARD:
        return _err("algorithm.klEstimator", a.kl_estimator, f"is not used by {a.name}, which puts the KL in the "
                    "reward as k1", f"remove klEstimator (or use a loss-term algorithm: {', '.join(GROUP_ALGORITHMS)})")
    if a.kl_coef == 0:
        return _err("algorithm.klEstimator", a.kl_estimator, "is not used: algorithm.klCoef is 0, so there is no KL "
                    "term", "set klCoef > 0 (e.g. 0.001), or remove klEstimator")


def _unused_knob(path: str, get, default: Any, users: tuple[str, ...], fix: str):
    """A knob only `users` read must keep its default under any other algorithm."""
    def check(s: RLRunSpec):
        value = get(s.algorithm)
        if value != default and s.algorithm.name not in users:
            return _err(path, value, f"is not used by algorithm {s.algorithm.name} (only by {', '.join(users)})", fix)
    return check


def _rule_overlong_buffer(s: RLRunSpec):
    ob, limit = s.algorithm.overlong_buffer, s.task.max_new_tokens
    if ob is not None and ob.length >= limit:
        return _err("algorithm.overlongBuffer.length", ob.length, f"leaves no penalty-free length below "
                    f"task.maxNewTokens ({limit})", f"use a length below {limit} (DAPO: a fifth of the maximum)")


def _rule_dynamic_sampling(s: RLRunSpec):
    if s.algorithm.dynamic_sampling.enabled and s.batch.samples_per_prompt < 2:
        return _err("algorithm.dynamicSampling.enabled", True, "keeps groups with mixed rewards, and a group of "
                    "batch.samplesPerPrompt = 1 never has them", "use samplesPerPrompt >= 2, or turn it off")


def _rule_max_rounds(s: RLRunSpec):
    ds = s.algorithm.dynamic_sampling
    if not ds.enabled and ds.max_rounds != DEFAULT_MAX_ROUNDS:
        return _err("algorithm.dynamicSampling.maxRounds", ds.max_rounds, "is not used: dynamic sampling is off",
                    "set algorithm.dynamicSampling.enabled: true, or remove maxRounds")


def _rule_staleness_placement(s: RLRunSpec):
    k = s.algorithm.max_staleness
    if k > 0 and s.placement == "colocated":
        return _err("algorithm.maxStaleness", k, "cannot overlap anything with placement colocated: the engines "
                    "sleep on the learner's accelerators while it trains",
                    "use placement: disaggregated (or auto), or maxStaleness: 0")


def _rule_mini_batches(s: RLRunSpec):
    m, lo = s.algorithm.mini_batches, s.batch.min_prompts
    if m > lo:
        return _err("algorithm.miniBatches", m, f"is more than batch.minPrompts ({lo}): a mini-batch holds at least "
                    "one prompt's group", f"use miniBatches <= {lo}, or raise batch.minPrompts")


def algorithm_rules() -> list[Rule]:
    """Algorithm knobs that a chosen algorithm would ignore are refused (a spec that validates runs as written)."""
    in_reward = _cel_list(KL_IN_REWARD)
    knobs = [  # (field, spec attribute, default, CEL literal, algorithms that use it, fix)
        ("gamma", "gamma", DEFAULT_GAMMA, "1.0", ("ppo", "reinforce++"), "remove gamma, or use ppo or reinforce++"),
        ("lambda", "lambda_", DEFAULT_LAMBDA, "0.95", ("ppo",), "remove lambda, or use algorithm.name: ppo"),
        ("valueCoef", "value_coef", DEFAULT_VALUE_COEF, "0.5", ("ppo",), "remove valueCoef, or use ppo"),
        ("valueClip", "value_clip", DEFAULT_VALUE_CLIP, "0.2", ("ppo",), "remove valueClip, or use ppo"),
        ("stdNormalize", "std_normalize", True, "true", ("grpo", "gspo"), "remove stdNormalize, or use grpo or gspo"),
        ("dropUniformGroups", "drop_uniform_groups", True, "true", GROUP_ALGORITHMS,
         "remove dropUniformGroups (every group trains under ppo and reinforce++)"),
    ]
    rules = [Rule(f"algorithm.{f}", f"self.algorithm.{f} == {lit} || self.algorithm.name in {_cel_list(users)}",
                  f"algorithm.{f} is used only by {', '.join(users)}: keep its default under other algorithms",
                  _unused_knob(f"algorithm.{f}", lambda a, attr=attr: getattr(a, attr), d, users, fix))
             for f, attr, d, lit, users, fix in knobs]
    return rules + [
        Rule("algorithm.klEstimator", f"self.algorithm.klEstimator == '{DEFAULT_KL_ESTIMATOR}' || "
             f"(self.algorithm.klCoef > 0.0 && !(self.algorithm.name in {in_reward}))",
             "algorithm.klEstimator needs klCoef > 0 and an algorithm with a KL loss term ("
             + ", ".join(GROUP_ALGORITHMS) + ")",
             _rule_kl_estimator),
        Rule("algorithm.overlongBuffer.length", "!has(self.algorithm.overlongBuffer) || "
             f"self.algorithm.overlongBuffer.length < {MAX_NEW_TOKENS_CEL}",
             "algorithm.overlongBuffer.length must be smaller than task.maxNewTokens", _rule_overlong_buffer),
        Rule("algorithm.dynamicSampling.enabled", "!self.algorithm.dynamicSampling.enabled || "
             "self.batch.samplesPerPrompt >= 2", "algorithm.dynamicSampling needs batch.samplesPerPrompt >= 2",
             _rule_dynamic_sampling),
        Rule("algorithm.dynamicSampling.maxRounds", "self.algorithm.dynamicSampling.enabled || "
             f"self.algorithm.dynamicSampling.maxRounds == {DEFAULT_MAX_ROUNDS}",
             "algorithm.dynamicSampling.maxRounds is used only with dynamicSampling.enabled", _rule_max_rounds),
        Rule("algorithm.maxStaleness", "self.algorithm.maxStaleness == 0 || self.placement != 'colocated'",
             "algorithm.maxStaleness > 0 needs placement disaggregated or auto (colocated engines cannot overlap "
             "the learner)", _rule_staleness_placement),
        Rule("algorithm.miniBatches", "self.algorithm.miniBatches <= self.batch.minPrompts",
             "algorithm.miniBatches must be <= batch.minPrompts (a mini-batch holds one prompt's group at least)",
             _rule_mini_batches),
    ]
