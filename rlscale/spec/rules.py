"""The RLRun spec's cross-field rules: each is checked here in Python (`validate`, the CLI, the
operator) and emitted as the same rule in CEL into the CRD (`rlscale crd`), so admission and
`validate` refuse the same specs with the same field named."""

from __future__ import annotations

from typing import Any

from rlscale.spec.algorithm import GROUP_ALGORITHMS
from rlscale.spec.algorithm_rules import algorithm_rules
from rlscale.spec.errors import MISSING, FieldError
from rlscale.spec.input_rules import input_rules
from rlscale.spec.lora_rules import lora_rules
from rlscale.spec.models import (
    BUILTIN_MODELS,
    BUILTIN_REWARDS,
    BUILTIN_TASKS,
    DEFAULT_GPUS_PER_NODE,
    MAX_LENGTH_CEL,
    MAX_NEW_TOKENS_CEL,
    MAX_REPLICAS,
    PROJECTED_SOURCES,
    RAY_TOKEN_SECRET_SUFFIX,
    RESERVED_ENV,
    RESERVED_ENV_PREFIXES,
    RESERVED_MOUNTS,
    RESERVED_VOLUMES,
    RESOURCE_NAMES,
    RESOURCE_PREFIXES,
    REWARD_EXPRESSION_RE,
    VALUE_FROM_KINDS,
    VOLUME_SOURCES,
    RLRunSpec,
    _RoleSpec,
)
from rlscale.spec.optimizer_rules import optimizer_rules
from rlscale.spec.rule_base import Rule, _cel_list, _err
from rlscale.spec.syntax import DNS_SUBDOMAIN_MAX, DNS_SUBDOMAIN_RE, MAX_RESOURCE_NAMES, full
from rlscale.spec.task_rules import task_rules
from rlscale.spec.tool_rules import tool_rules


def _rule_grpo_group(s: RLRunSpec):
    name = s.algorithm.name
    if name in GROUP_ALGORITHMS and s.batch.samples_per_prompt < 2:
        who = "GRPO" if name == "grpo" else name
        return _err("batch.samplesPerPrompt", s.batch.samples_per_prompt, f"is too small for {who}, whose advantages "
                    "compare samples within a group",
                    "use 2 or more (8 is typical), or algorithm.name: ppo or reinforce++")


def _rule_micro_batch_tokens(s: RLRunSpec):
    t = s.batch.micro_batch_tokens
    if t is not None and t < s.model.max_length:
        return _err("batch.microBatchTokens", t, f"cannot hold one sequence of model.maxLength ({s.model.max_length})",
                    f"use microBatchTokens >= {s.model.max_length}, or leave it unset")


def _rule_prompt_bounds(s: RLRunSpec):
    if s.batch.min_prompts > s.batch.max_prompts:
        return _err("batch.minPrompts", s.batch.min_prompts, f"is above batch.maxPrompts ({s.batch.max_prompts})",
                    "make minPrompts <= maxPrompts")


def _rule_fixed_prompts(s: RLRunSpec):
    p = s.batch.prompts
    if p != "auto" and not (s.batch.min_prompts <= p <= s.batch.max_prompts):
        return _err("batch.prompts", p, f"lies outside [batch.minPrompts, batch.maxPrompts] = [{s.batch.min_prompts}, "
                    f"{s.batch.max_prompts}]",
                    "change prompts, or widen minPrompts/maxPrompts")


def _rule_new_tokens(s: RLRunSpec):
    if s.task.max_new_tokens >= s.model.max_length:
        return _err("task.maxNewTokens", s.task.max_new_tokens, "leaves no room for the prompt within model.maxLength "
                    f"({s.model.max_length})",
                    "make maxNewTokens smaller than model.maxLength")


def _gpu_need(s: RLRunSpec) -> int:
    """The fewest GPUs the placement can run on: one replica of each role unless set (colocated, and auto
    which may choose it, need the learner pods only: the engines share their GPUs)."""
    r = 1 if s.rollout.replicas == "auto" else s.rollout.replicas
    lr = 1 if s.learner.replicas == "auto" else s.learner.replicas
    learners = lr * s.learner.gpus_per_replica
    return learners if _may_colocate(s) else r * s.rollout.gpus_per_replica + learners


def _may_colocate(s: RLRunSpec) -> bool:
    return s.placement == "colocated" or (s.placement == "auto" and s.rollout.replicas == "auto")


def _rule_gpu_budget(s: RLRunSpec):
    if s.hardware.accelerator != "cpu" and s.budget.gpus < _gpu_need(s):
        what = ("the learner replicas (colocated: the engines share their GPUs)" if _may_colocate(s)
                else "the rollout and learner replicas")
        return _err("budget.gpus", s.budget.gpus,
                    f"does not cover {what} ({_gpu_need(s)} GPUs: replicas x gpusPerReplica, one each when auto)",
                    f"raise budget.gpus to at least {_gpu_need(s)}, or lower the replicas or gpusPerReplica "
                    f"(learner.gpusPerReplica is {s.learner.gpus_per_replica}; unset, it is a node's GPUs)")


def _rule_ranks_per_replica(s: RLRunSpec):
    k = s.learner.ranks_per_replica
    if k is not None and s.hardware.accelerator != "cpu" and k != s.learner.gpus_per_replica:
        return _err("learner.ranksPerReplica", k, f"differs from learner.gpusPerReplica ({s.learner.gpus_per_replica}) "
                    f"on accelerator {s.hardware.accelerator}: each rank drives one GPU",
                    "leave ranksPerReplica unset (one rank per GPU), or set gpusPerReplica to the same number")


def _rule_pod_on_node(s: RLRunSpec):
    if s.hardware.accelerator == "cpu":
        return None
    node = s.hardware.node_gpus
    for role in ("learner", "rollout"):
        g = getattr(s, role).gpus_per_replica
        if g > node:
            return _err(f"{role}.gpusPerReplica", g, f"is above hardware.gpusPerNode ({node}): a pod runs on one node",
                        f"use at most {node} GPUs a pod (more {role} replicas instead), or set hardware.gpusPerNode")
    return None


def _rule_colocated_replicas(s: RLRunSpec):
    if s.placement == "colocated" and s.rollout.replicas != "auto":
        return _err("rollout.replicas", s.rollout.replicas, "is set with placement colocated, where each learner pod "
                    "runs one engine (the rollout replicas are the learner pods)",
                    "leave rollout.replicas auto, or use placement disaggregated")


def _rule_colocated_engines(s: RLRunSpec):
    lr = s.learner.replicas
    if s.placement == "colocated" and lr != "auto" and lr > s.rollout.max_replicas:
        return _err("rollout.maxReplicas", s.rollout.max_replicas, f"is below learner.replicas ({lr}) with placement "
                    "colocated, where every learner pod runs an engine",
                    f"raise rollout.maxReplicas to {lr}, or lower learner.replicas")


def _rule_gpus_per_replica(s: RLRunSpec):
    if s.hardware.accelerator != "cpu" and (s.rollout.gpus_per_replica == 0 or s.learner.gpus_per_replica == 0):
        which = "rollout" if s.rollout.gpus_per_replica == 0 else "learner"
        return _err(f"{which}.gpusPerReplica", 0, f"is not allowed on accelerator {s.hardware.accelerator}",
                    "use 1 or more, or hardware.accelerator: cpu")


def _rule_replica_bounds(role: str):
    def check(s: RLRunSpec):
        r: _RoleSpec = getattr(s, role)
        if r.replicas != "auto" and r.replicas > r.max_replicas:
            return _err(f"{role}.replicas", r.replicas, f"is above {role}.maxReplicas ({r.max_replicas})",
                        f"lower replicas or raise maxReplicas (at most {MAX_REPLICAS})")
    return check


def _is_accuracy(metric: str) -> bool:
    return metric.endswith("accuracy")


def _rule_accuracy_target(s: RLRunSpec):
    if _is_accuracy(s.target.metric) and not (0 < s.target.value <= 1):
        return _err("target.value", s.target.value, f"is outside (0, 1], the range of {s.target.metric}",
                    "use a fraction such as 0.8")


def _rule_batch_within_budget(s: RLRunSpec):
    if s.batch.prompts != "auto":
        n = s.batch.prompts * s.batch.samples_per_prompt
        if n > s.budget.max_samples:
            return _err("budget.maxSamples", s.budget.max_samples, f"is smaller than one step's batch ({n} samples)",
                        "raise maxSamples or lower batch.prompts")


def _rule_clip_high(s: RLRunSpec):
    hi = s.algorithm.clip_ratio_high
    if hi is not None and hi < s.algorithm.clip_ratio:
        return _err("algorithm.clipRatioHigh", hi, f"is below algorithm.clipRatio ({s.algorithm.clip_ratio})",
                    "asymmetric clipping widens the upper side: use a value >= clipRatio")


def _rule_betas(s: RLRunSpec):
    b1, b2 = s.optimizer.betas
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        return _err("optimizer.betas", [b1, b2], "must each lie in [0, 1)", "use e.g. [0.9, 0.999]")


def _rule_model_named(s: RLRunSpec):
    if s.model.path is None:
        return FieldError("spec.model.path", MISSING,
                          f"is required on accelerator {s.hardware.accelerator} "
                          "(only a CPU run defaults to the 3.4M-parameter builtin:tiny-arith)",
                          "name the model to train: a hub id in the model volume's Hugging Face cache such as "
                          "Qwen/Qwen2.5-7B-Instruct, or a directory in Hugging Face format")


def _rule_builtin_model(s: RLRunSpec):
    p = s.model.path
    if p is not None and p.startswith("builtin:") and p not in BUILTIN_MODELS:
        return _err("model.path", p, "is not a builtin model", f"use one of {', '.join(BUILTIN_MODELS)}, a hub id or a "
                    "local directory")


def _rule_builtin_task(s: RLRunSpec):
    t = s.task
    if t.dataset is None and t.name not in BUILTIN_TASKS:
        problem = "is not a builtin task" + ("" if t.name.startswith("builtin:") else ", and task.dataset is unset")
        return _err("task.name", t.name, problem,
                    f"use {' or '.join(BUILTIN_TASKS)}, or set task.dataset to a JSONL/Parquet/CSV file of prompts and "
                    "answers")
    if t.dataset is not None and t.name.startswith("builtin:"):
        return _err("task.name", t.name, "names a builtin task, but task.dataset is set",
                    "name the dataset task (e.g. name: my-data) or leave name unset; or remove task.dataset")


def _rule_reward(s: RLRunSpec):
    r = s.task.reward
    if not full(REWARD_EXPRESSION_RE, r):
        return _err("task.reward", r, "is not a reward expression",
                    f"use {', '.join(BUILTIN_REWARDS)}, a plug-in module:function such as mypkg.rewards:score, "
                    "reward-model (with task.rewardModel), or a weighted sum such as 0.9*math + 0.1*format")


def _rule_plugin_volume(s: RLRunSpec):
    t = s.task
    # A plug-in term is the only part of a reward expression with a colon (module:function).
    if t.plugin_volume is not None and ":" not in t.reward:
        return _err("task.pluginVolume", t.plugin_volume, f"is set, but task.reward {t.reward!r} names no plug-in",
                    "name the plug-in in task.reward (e.g. my_reward:score), or remove task.pluginVolume")


def _rule_prompt_source(s: RLRunSpec):
    t = s.task
    if t.messages_field and t.prompt_field:
        return _err("task.promptField", t.prompt_field, "is set together with task.messagesField",
                    "keep one: promptField for plain text, messagesField for chat messages")


def _rule_messages_need_chat(s: RLRunSpec):
    t = s.task
    if t.messages_field and t.chat is False:
        return _err("task.chat", False, "turns the chat template off, but task.messagesField holds chat messages",
                    "leave chat unset (or true), or use a promptField of plain text")


def _rule_eval_split_needs_dataset(s: RLRunSpec):
    t = s.task
    if t.dataset is None and t.eval_split is not None:
        return _err("task.evalSplit", t.eval_split, "needs task.dataset (builtin tasks have their own held-out split)",
                    "remove evalSplit, or set task.dataset")


def _rule_task_prompt_room(s: RLRunSpec):
    need = s.task.expected_prompt_tokens + s.task.max_new_tokens
    if need > s.model.max_length:
        return _err("model.maxLength", s.model.max_length,
                    f"is shorter than task.expectedPromptTokens + task.maxNewTokens ({need})",
                    f"raise maxLength to at least {need}")


def _rule_response_hint(s: RLRunSpec):
    if s.task.expected_response_tokens > s.task.max_new_tokens:
        return _err("task.expectedResponseTokens", s.task.expected_response_tokens,
                    f"is above task.maxNewTokens ({s.task.max_new_tokens})",
                    "a response never exceeds maxNewTokens: lower the hint or raise maxNewTokens")


def _is_token_secret(name: Any) -> bool:
    return isinstance(name, str) and name.endswith(RAY_TOKEN_SECRET_SUFFIX)


def _name_err(path: str, name: Any) -> FieldError | None:
    """A Secret a volume or env entry names: a valid object name, and no run's Ray token Secret."""
    if isinstance(name, str) and (len(name) > DNS_SUBDOMAIN_MAX or not full(DNS_SUBDOMAIN_RE, name)):
        return _err(path, name, "is not a valid Secret name (a DNS subdomain: lowercase letters, digits, '-' and '.', "
                    f"at most {DNS_SUBDOMAIN_MAX} characters)", "give the name `kubectl get secret` shows")
    return _token_secret_err(path, name) if _is_token_secret(name) else None


def _token_secret_err(path: str, name: str) -> FieldError:
    return _err(path, name, f"names a run's Ray token Secret (the operator's *{RAY_TOKEN_SECRET_SUFFIX}), which "
                "lets a pod join that run's Ray cluster", "name a Secret of your own; the operator already gives "
                "each pod its run's token")


_SOURCE_FIX = ("use a persistentVolumeClaim bound by your admin (allowed sources: " + ", ".join(VOLUME_SOURCES) + ")")


def _projected_err(path: str, body: Any) -> FieldError | None:
    sources = body.get("sources") if isinstance(body, dict) else None
    for i, src in enumerate(sources if isinstance(sources, list) else []):
        keys = list(src) if isinstance(src, dict) else []
        if len(keys) != 1:
            return _err(f"{path}.sources[{i}]", src, "must name exactly one projection",
                        "use one of: " + ", ".join(PROJECTED_SOURCES))
        if keys[0] not in PROJECTED_SOURCES:
            return _err(f"{path}.sources[{i}].{keys[0]}", src[keys[0]], "is not a projection an RLRun may use",
                        "use one of: " + ", ".join(PROJECTED_SOURCES))
        name = src.get("secret", {}).get("name") if isinstance(src.get("secret"), dict) else None
        if err := _name_err(f"{path}.sources[{i}].secret.name", name):
            return err
    return None


def _source_err(path: str, source: dict[str, Any]) -> FieldError | None:
    """A volume source that is not exactly one of VOLUME_SOURCES, or that reaches a Ray token Secret."""
    if len(source) != 1:
        return _err(path, source, "must name exactly one volume source",
                    "e.g. {persistentVolumeClaim: {claimName: data}}; " + _SOURCE_FIX)
    kind, body = next(iter(source.items()))
    if kind not in VOLUME_SOURCES:
        return _err(f"{path}.{kind}", body, "is not a volume source an RLRun may use (it reaches a node's disk or a "
                    "storage server past the namespace's admin)", _SOURCE_FIX)
    if kind == "secret" and isinstance(body, dict) and (err := _name_err(f"{path}.secret.secretName",
                                                                          body.get("secretName"))):
        return err
    if kind == "projected":
        return _projected_err(f"{path}.projected", body)
    spec = ((body or {}).get("volumeClaimTemplate") or {}).get("spec") if kind == "ephemeral" else None
    for key in ("dataSource", "dataSourceRef"):
        if isinstance(spec, dict) and key in spec:
            return _err(f"{path}.ephemeral.volumeClaimTemplate.spec.{key}", spec[key], "would clone a claim or "
                        "snapshot into the run's volume, possibly another team's", "use an empty ephemeral volume, "
                        "or a persistentVolumeClaim your admin bound with the data")
    return None


def _rule_volume_source(path: str, get):
    def check(s: RLRunSpec):
        source = get(s)
        return None if source is None else _source_err(path, source)
    return check


def _value_from_err(path: str, value_from: dict[str, Any]) -> FieldError | None:
    allowed = "use one of: " + ", ".join(VALUE_FROM_KINDS)
    if len(value_from) != 1:
        return _err(path, value_from, "must name exactly one source", allowed)
    kind, body = next(iter(value_from.items()))
    if kind not in VALUE_FROM_KINDS:
        return _err(f"{path}.{kind}", body, "is not a valueFrom an RLRun may use", allowed)
    name = body.get("name") if isinstance(body, dict) else None
    if kind == "secretKeyRef" and (err := _name_err(f"{path}.secretKeyRef.name", name)):
        return err
    return None


def _rule_pod_env(role: str):
    def check(s: RLRunSpec):
        for i, e in enumerate(getattr(s, role).pod.env):
            if e.name in RESERVED_ENV:
                return _err(f"{role}.pod.env[{i}].name", e.name, "is set by the operator in every pod",
                            "choose another name (the operator's own: " + ", ".join(RESERVED_ENV) + ")")
            if e.name.startswith(RESERVED_ENV_PREFIXES):
                return _err(f"{role}.pod.env[{i}].name", e.name, "is a setting of the NVIDIA container toolkit, which "
                            "decides the GPUs a container sees", f"choose another name; GPUs come through "
                            f"{role}.gpusPerReplica")
            if e.value_from is not None and (err := _value_from_err(f"{role}.pod.env[{i}].valueFrom", e.value_from)):
                return err
    return check


def _rule_pod_volumes(role: str):
    def check(s: RLRunSpec):
        for i, v in enumerate(getattr(s, role).pod.volumes):
            if v.name in RESERVED_VOLUMES:
                return _err(f"{role}.pod.volumes[{i}].name", v.name, "is a volume the operator mounts itself",
                            "choose another name (taken: " + ", ".join(RESERVED_VOLUMES) + ")")
            if err := _source_err(f"{role}.pod.volumes[{i}]", dict(v.model_extra or {})):
                return err
    return check


def _rule_pod_mounts(role: str):
    def check(s: RLRunSpec):
        pod = getattr(s, role).pod
        names = {v.name for v in pod.volumes}
        for i, m in enumerate(pod.volume_mounts):
            if m.name not in names:
                return _err(f"{role}.pod.volumeMounts[{i}].name", m.name, f"is not a volume in {role}.pod.volumes",
                            "add the volume there, or mount one of: " + (", ".join(sorted(names)) or "(none declared)"))
            if m.mount_path.rstrip("/") in RESERVED_MOUNTS:
                return _err(f"{role}.pod.volumeMounts[{i}].mountPath", m.mount_path,
                            "is a path the operator mounts itself",
                            "mount it elsewhere (taken: " + ", ".join(RESERVED_MOUNTS) + ")")
    return check


def _resource_ok(name: str) -> bool:
    return name in RESOURCE_NAMES or name.startswith(RESOURCE_PREFIXES)


def _rule_resources(role: str):
    def check(s: RLRunSpec):
        for key, names in getattr(s, role).resources.items():
            if key not in ("requests", "limits"):
                return _err(f"{role}.resources.{key}", names, "is not an RLRun's to set (only requests and limits)",
                            "remove it; GPUs come through gpusPerReplica")
            if isinstance(names, dict) and len(names) > MAX_RESOURCE_NAMES:
                return _err(f"{role}.resources.{key}", f"{len(names)} names", f"holds more than {MAX_RESOURCE_NAMES}",
                            "request only " + ", ".join(RESOURCE_NAMES) + " and hugepages-*")
            for name in names if isinstance(names, dict) else []:
                if not _resource_ok(name):
                    return _err(f"{role}.resources.{key}[{name!r}]", names[name], "is not a resource an RLRun may "
                                "request: GPUs and other devices come through gpusPerReplica alone (which budget.gpus "
                                "and the GPU rules count)", f"remove it and set {role}.gpusPerReplica; allowed: "
                                + ", ".join(RESOURCE_NAMES) + ", " + ", ".join(p + "*" for p in RESOURCE_PREFIXES))
    return check


def _resource_rule(role: str) -> Rule:
    r = f"self.{role}.resources"
    ok = " || ".join([f"k in {_cel_list(RESOURCE_NAMES)}", *(f"k.startsWith('{p}')" for p in RESOURCE_PREFIXES)])
    return Rule(f"{role}.resources", f"!has({r}) || ((!has({r}.requests) || {r}.requests.all(k, {ok})) && "
                f"(!has({r}.limits) || {r}.limits.all(k, {ok})))",
                f"{role}.resources may request and limit only " + ", ".join(RESOURCE_NAMES) + " and hugepages-*: "
                f"GPUs come through {role}.gpusPerReplica", _rule_resources(role))


def _cel_one_of(x: str, keys: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"has({x}.{k})" for k in keys) + "].exists_one(b, b)"


def _cel_not_token(x: str) -> str:
    return f"(!has({x}) || !{x}.endsWith('{RAY_TOKEN_SECRET_SUFFIX}'))"


def _cel_source(x: str) -> str:
    """CEL for _source_err over the volume source `x`. The CRD declares only the allowed sources
    (crd.py), so any other is pruned before CEL runs and leaves `x` with no source."""
    return (f"{_cel_one_of(x, VOLUME_SOURCES)} && (!has({x}.secret) || {_cel_not_token(x + '.secret.secretName')})"
            f" && (!has({x}.projected) || !has({x}.projected.sources) || {x}.projected.sources.all(p, "
            f"{_cel_one_of('p', PROJECTED_SOURCES)} && (!has(p.secret) || {_cel_not_token('p.secret.name')})))"
            f" && {_cel_no_clone(x)}")


def _cel_no_clone(x: str) -> str:
    t = f"{x}.ephemeral.volumeClaimTemplate"
    return (f"(!has({x}.ephemeral) || !has({t}) || !has({t}.spec) || "
            f"(!has({t}.spec.dataSource) && !has({t}.spec.dataSourceRef)))")


def _cel_value_from(x: str) -> str:
    return (f"{_cel_one_of(x, VALUE_FROM_KINDS)} && "
            f"(!has({x}.secretKeyRef) || {_cel_not_token(x + '.secretKeyRef.name')})")


_SOURCE_MESSAGE = (" must name exactly one volume source of " + ", ".join(VOLUME_SOURCES)
                   + f", no Secret named *{RAY_TOKEN_SECRET_SUFFIX}, and no ephemeral claim cloned from a dataSource")


def _volume_rules() -> list[Rule]:
    """The single volume sources of the spec (model, checkpoints, plug-ins) come from the allowlist."""
    fields = [("model.volume", lambda s: s.model.volume), ("checkpoint.volume", lambda s: s.checkpoint.volume),
              ("task.pluginVolume", lambda s: s.task.plugin_volume)]
    return [Rule(path, f"!has(self.{path}) || {_cel_source('self.' + path)}", path + _SOURCE_MESSAGE,
                 _rule_volume_source(path, get)) for path, get in fields]


def _pod_rules(role: str) -> list[Rule]:
    """A role's pod overrides may add to what the operator builds, never replace it, and reach
    only what VOLUME_SOURCES and VALUE_FROM_KINDS allow."""
    return [
        Rule(f"{role}.pod.env", f"!has(self.{role}.pod.env) || "
             f"self.{role}.pod.env.all(e, !(e.name in {_cel_list(RESERVED_ENV)}) && "
             + "".join(f"!e.name.startsWith('{x}') && " for x in RESERVED_ENV_PREFIXES) +
             f"(!has(e.valueFrom) || {_cel_value_from('e.valueFrom')}))",
             f"{role}.pod.env must not set a variable the operator sets nor NVIDIA_*, and its valueFrom must be one of "
             + ", ".join(VALUE_FROM_KINDS) + f" naming no Secret *{RAY_TOKEN_SECRET_SUFFIX}", _rule_pod_env(role)),
        Rule(f"{role}.pod.volumes", f"!has(self.{role}.pod.volumes) || "
             f"self.{role}.pod.volumes.all(v, !(v.name in {_cel_list(RESERVED_VOLUMES)}) && {_cel_source('v')})",
             f"{role}.pod.volumes must not reuse a volume name the operator uses, and each" + _SOURCE_MESSAGE,
             _rule_pod_volumes(role)),
        Rule(f"{role}.pod.volumeMounts",
             f"!has(self.{role}.pod.volumeMounts) || self.{role}.pod.volumeMounts.all(m, "
             f"has(self.{role}.pod.volumes) && self.{role}.pod.volumes.exists(v, v.name == m.name) && "
             f"!(m.mountPath in {_cel_list(RESERVED_MOUNTS)}))",
             f"each {role}.pod.volumeMounts entry must name a volume of {role}.pod.volumes and a path "
             "the operator does not use", _rule_pod_mounts(role)),
    ]


_REPLICA_CEL = "(type(self.{r}.replicas) == string ? 1 : int(self.{r}.replicas))"

# CEL for the resolved GPU counts (the CRD leaves learner.gpusPerReplica and hardware.gpusPerNode unset
# when the spec does; RLRunSpec._default_learner_gpus resolves them so in Python).
_NODE_GPUS_CEL = f"(has(self.hardware.gpusPerNode) ? self.hardware.gpusPerNode : {DEFAULT_GPUS_PER_NODE})"
_LEARNER_GPUS_CEL = ("(has(self.learner.gpusPerReplica) ? self.learner.gpusPerReplica : "
                     "(self.budget.gpus / 2 < 1 ? 1 : "
                     f"({_NODE_GPUS_CEL} < self.budget.gpus / 2 ? {_NODE_GPUS_CEL} : self.budget.gpus / 2)))")

RULES: list[Rule] = [
    Rule("batch.samplesPerPrompt",
         f"!(self.algorithm.name in {_cel_list(GROUP_ALGORITHMS)}) || self.batch.samplesPerPrompt >= 2",
         "batch.samplesPerPrompt must be >= 2 for GRPO and the other group-baseline algorithms ("
         + ", ".join(GROUP_ALGORITHMS[1:]) + ")", _rule_grpo_group),
    Rule("batch.microBatchTokens", "!has(self.batch.microBatchTokens) || self.batch.microBatchTokens >= "
         + MAX_LENGTH_CEL, "batch.microBatchTokens must hold one sequence of model.maxLength",
         _rule_micro_batch_tokens),
    Rule("batch.minPrompts", "self.batch.minPrompts <= self.batch.maxPrompts",
         "batch.minPrompts must be <= batch.maxPrompts", _rule_prompt_bounds),
    Rule("batch.prompts",
         "type(self.batch.prompts) == string || (int(self.batch.prompts) >= self.batch.minPrompts && "
         "int(self.batch.prompts) <= self.batch.maxPrompts)",
         "batch.prompts must lie within [batch.minPrompts, batch.maxPrompts]", _rule_fixed_prompts),
    Rule("task.maxNewTokens", f"{MAX_NEW_TOKENS_CEL} < {MAX_LENGTH_CEL}",
         "task.maxNewTokens must be smaller than model.maxLength", _rule_new_tokens),
    Rule("model.maxLength", f"self.task.expectedPromptTokens + {MAX_NEW_TOKENS_CEL} <= {MAX_LENGTH_CEL}",
         "model.maxLength must hold task.expectedPromptTokens + task.maxNewTokens", _rule_task_prompt_room),
    Rule("task.expectedResponseTokens", f"self.task.expectedResponseTokens <= {MAX_NEW_TOKENS_CEL}",
         "task.expectedResponseTokens must be <= task.maxNewTokens", _rule_response_hint),
    Rule("budget.gpus",
         "self.hardware.accelerator == 'cpu' || self.budget.gpus >= "
         "(self.placement == 'colocated' || (self.placement == 'auto' && type(self.rollout.replicas) == string) ? 0 : "
         + _REPLICA_CEL.format(r="rollout") + " * self.rollout.gpusPerReplica) + "
         + _REPLICA_CEL.format(r="learner") + " * " + _LEARNER_GPUS_CEL,
         "budget.gpus must cover at least one learner replica, and one rollout replica unless colocated",
         _rule_gpu_budget),
    Rule("learner.ranksPerReplica", "self.hardware.accelerator == 'cpu' || !has(self.learner.ranksPerReplica) || "
         "self.learner.ranksPerReplica == " + _LEARNER_GPUS_CEL,
         "learner.ranksPerReplica must equal learner.gpusPerReplica on a GPU accelerator", _rule_ranks_per_replica),
    Rule("rollout.replicas", "self.placement != 'colocated' || type(self.rollout.replicas) == string",
         "rollout.replicas must be auto with placement colocated (one engine per learner pod)",
         _rule_colocated_replicas),
    Rule("rollout.maxReplicas", "self.placement != 'colocated' || type(self.learner.replicas) == string || "
         "int(self.learner.replicas) <= self.rollout.maxReplicas",
         "rollout.maxReplicas must be >= learner.replicas with placement colocated (an engine on every learner pod)",
         _rule_colocated_engines),
    Rule("rollout.gpusPerReplica",
         "self.hardware.accelerator == 'cpu' || (self.rollout.gpusPerReplica > 0 && " + _LEARNER_GPUS_CEL + " > 0)",
         "gpusPerReplica must be >= 1 unless hardware.accelerator is cpu", _rule_gpus_per_replica),
    Rule("learner.gpusPerReplica", "self.hardware.accelerator == 'cpu' || (self.rollout.gpusPerReplica <= "
         + _NODE_GPUS_CEL + " && " + _LEARNER_GPUS_CEL + " <= " + _NODE_GPUS_CEL + ")",
         "gpusPerReplica must not exceed hardware.gpusPerNode (8 unless set): a pod runs on one node",
         _rule_pod_on_node),
    Rule("rollout.replicas", "type(self.rollout.replicas) == string || int(self.rollout.replicas) <= "
         "self.rollout.maxReplicas",
         "rollout.replicas must be <= rollout.maxReplicas", _rule_replica_bounds("rollout")),
    Rule("learner.replicas", "type(self.learner.replicas) == string || int(self.learner.replicas) <= "
         "self.learner.maxReplicas",
         "learner.replicas must be <= learner.maxReplicas", _rule_replica_bounds("learner")),
    Rule("target.value",
         "!self.target.metric.endsWith('accuracy') || (self.target.value > 0.0 && self.target.value <= 1.0)",
         "target.value of an accuracy metric must lie in (0, 1]", _rule_accuracy_target),
    Rule("budget.maxSamples",
         "type(self.batch.prompts) == string || int(self.batch.prompts) * self.batch.samplesPerPrompt <= "
         "self.budget.maxSamples",
         "budget.maxSamples must hold at least one step's batch", _rule_batch_within_budget),
    Rule("algorithm.clipRatioHigh", "!has(self.algorithm.clipRatioHigh) || self.algorithm.clipRatioHigh >= "
         "self.algorithm.clipRatio",
         "algorithm.clipRatioHigh must be >= algorithm.clipRatio", _rule_clip_high),
    Rule("optimizer.betas", "self.optimizer.betas.all(b, b >= 0.0 && b < 1.0)",
         "optimizer.betas must each lie in [0, 1)", _rule_betas),
    *optimizer_rules(),
    Rule("model.path", "self.hardware.accelerator == 'cpu' || has(self.model.path)",
         "model.path is required unless hardware.accelerator is cpu", _rule_model_named),
    Rule("model.path", "!has(self.model.path) || !self.model.path.startsWith('builtin:') || self.model.path in "
         + repr(list(BUILTIN_MODELS)).replace('"', "'"),
         "model.path names an unknown builtin model", _rule_builtin_model),
    Rule("task.name",
         "has(self.task.dataset) ? (!has(self.task.name) || !self.task.name.startsWith('builtin:')) : "
         "(!has(self.task.name) || self.task.name in " + repr(list(BUILTIN_TASKS)).replace('"', "'") + ")",
         "task.name must be a builtin task without task.dataset, and not one with it", _rule_builtin_task),
    Rule("task.promptField", "!has(self.task.promptField) || !has(self.task.messagesField)",
         "task.promptField and task.messagesField exclude each other", _rule_prompt_source),
    Rule("task.chat", "!has(self.task.messagesField) || !has(self.task.chat) || self.task.chat",
         "task.messagesField needs the chat template (task.chat must not be false)", _rule_messages_need_chat),
    Rule("task.evalSplit", "has(self.task.dataset) || !has(self.task.evalSplit)",
         "task.evalSplit needs task.dataset", _rule_eval_split_needs_dataset),
    Rule("task.reward",
         "self.task.reward.matches('" + REWARD_EXPRESSION_RE + "')",
         "task.reward must be exact-match, math, format, module:function, reward-model, or a weighted sum of them",
         _rule_reward),
    Rule("task.pluginVolume", "!has(self.task.pluginVolume) || self.task.reward.contains(':')",
         "task.pluginVolume needs a plug-in (module:function) in task.reward", _rule_plugin_volume),
    *algorithm_rules(),
    *lora_rules(),
    *task_rules(),
    *tool_rules(),
    *_volume_rules(),
    *_pod_rules("rollout"),
    *_pod_rules("learner"),
    *input_rules(),
    _resource_rule("rollout"),
    _resource_rule("learner"),
]


def check_rules(spec: RLRunSpec) -> list[FieldError]:
    """Every cross-field problem of a structurally valid spec."""
    return [e for rule in RULES if (e := rule.check(spec)) is not None]
