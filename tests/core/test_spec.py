"""The RLRun spec: structure, every cross-field rule, and errors that name field, value and fix."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlscale.spec import SpecError, load_rlrun, parse_rlrun, parse_spec
from rlscale.spec.rules import RULES
from tests.conftest import EXAMPLES, rlrun_dict


def errors_of(spec: dict) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    return [str(e) for e in info.value.errors]


def test_defaults_are_a_valid_spec():
    s = parse_spec({"hardware": {"accelerator": "cpu"}})
    assert s.batch.prompts == "auto" and s.algorithm.name == "grpo"
    assert s.algorithm.lambda_ == 0.95
    assert s.model.path == "builtin:tiny-arith" and s.task.name == "builtin:arithmetic"


def test_a_gpu_spec_must_name_its_model():
    """The defaults alone (8 H100s) once validated and would have trained the 3.4M-parameter toy."""
    assert errors_of({}) == ["spec.model.path: is required on accelerator H100 (only a CPU run defaults to the "
                             "3.4M-parameter builtin:tiny-arith); name the model to train: a hub id in the model "
                             "volume's Hugging Face cache such as Qwen/Qwen2.5-7B-Instruct, or a directory in "
                             "Hugging Face format"]
    assert parse_spec({"model": {"path": "Qwen/Qwen2.5-7B-Instruct"}}).model.path == "Qwen/Qwen2.5-7B-Instruct"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_validate(path):
    assert load_rlrun(path).spec is not None


# (spec, the field path the error must name, a word of the fix)
CROSS_FIELD = [
    ({"batch": {"samplesPerPrompt": 1}}, "spec.batch.samplesPerPrompt", "2 or more"),
    ({"batch": {"microBatchTokens": 100}}, "spec.batch.microBatchTokens", "microBatchTokens >= 128"),
    ({"batch": {"minPrompts": 64, "maxPrompts": 8}}, "spec.batch.minPrompts", "<= maxPrompts"),
    ({"batch": {"prompts": 512}}, "spec.batch.prompts", "widen"),
    ({"model": {"maxLength": 128}, "task": {"maxNewTokens": 128}}, "spec.task.maxNewTokens",
     "smaller than model.maxLength"),
    ({"model": {"maxLength": 128}, "task": {"expectedPromptTokens": 100, "maxNewTokens": 60}}, "spec.model.maxLength",
     "at least 160"),
    ({"task": {"expectedResponseTokens": 9, "maxNewTokens": 8}}, "spec.task.expectedResponseTokens", "maxNewTokens"),
    ({"budget": {"gpus": 1}, "placement": "disaggregated"}, "spec.budget.gpus", "at least 2"),
    ({"learner": {"gpusPerReplica": 8, "ranksPerReplica": 2}}, "spec.learner.ranksPerReplica", "unset"),
    ({"placement": "colocated", "rollout": {"replicas": 2}}, "spec.rollout.replicas", "disaggregated"),
    ({"placement": "colocated", "learner": {"replicas": 4}, "rollout": {"maxReplicas": 2}, "budget": {"gpus": 8}},
     "spec.rollout.maxReplicas", "raise rollout.maxReplicas to 4"),
    ({"budget": {"gpus": 8}, "rollout": {"replicas": 6}, "learner": {"replicas": 4, "gpusPerReplica": 1}},
     "spec.budget.gpus", "at least 10"),
    ({"budget": {"gpus": 16}, "learner": {"gpusPerReplica": 16}}, "spec.learner.gpusPerReplica", "at most 8"),
    ({"hardware": {"gpusPerNode": 4}, "rollout": {"gpusPerReplica": 8}, "learner": {"gpusPerReplica": 4}},
     "spec.rollout.gpusPerReplica", "at most 4"),
    ({"rollout": {"gpusPerReplica": 0}}, "spec.rollout.gpusPerReplica", "accelerator: cpu"),
    ({"rollout": {"replicas": 9}}, "spec.rollout.replicas", "maxReplicas"),
    ({"learner": {"replicas": 9, "maxReplicas": 4}, "budget": {"gpus": 64}}, "spec.learner.replicas", "maxReplicas"),
    ({"target": {"value": 1.5}}, "spec.target.value", "fraction"),
    ({"target": {"value": 0}}, "spec.target.value", "fraction"),
    ({"batch": {"prompts": 64}, "budget": {"maxSamples": 100}}, "spec.budget.maxSamples", "raise maxSamples"),
    ({"algorithm": {"clipRatio": 0.3, "clipRatioHigh": 0.2}}, "spec.algorithm.clipRatioHigh", ">= clipRatio"),
    ({"algorithm": {"name": "rloo"}, "batch": {"samplesPerPrompt": 1}}, "spec.batch.samplesPerPrompt", "2 or more"),
    ({"algorithm": {"gamma": 0.9}}, "spec.algorithm.gamma", "use ppo or reinforce++"),
    ({"algorithm": {"lambda": 0.9}}, "spec.algorithm.lambda", "algorithm.name: ppo"),
    ({"algorithm": {"name": "gspo", "valueCoef": 1.0}}, "spec.algorithm.valueCoef", "use ppo"),
    ({"algorithm": {"valueClip": 0.5}}, "spec.algorithm.valueClip", "use ppo"),
    ({"algorithm": {"name": "rloo", "stdNormalize": False}}, "spec.algorithm.stdNormalize", "grpo or gspo"),
    ({"algorithm": {"name": "ppo", "dropUniformGroups": False}}, "spec.algorithm.dropUniformGroups",
     "remove dropUniformGroups"),
    ({"algorithm": {"klEstimator": "k2"}}, "spec.algorithm.klEstimator", "klCoef > 0"),
    ({"algorithm": {"name": "reinforce++", "klCoef": 0.1, "klEstimator": "k1"}}, "spec.algorithm.klEstimator",
     "remove klEstimator"),
    ({"algorithm": {"overlongBuffer": {"length": 8}}}, "spec.algorithm.overlongBuffer.length", "below 8"),
    ({"algorithm": {"name": "ppo", "dynamicSampling": {"enabled": True}}, "batch": {"samplesPerPrompt": 1}},
     "spec.algorithm.dynamicSampling.enabled", "samplesPerPrompt >= 2"),
    ({"algorithm": {"maxStaleness": 1}, "placement": "colocated"}, "spec.algorithm.maxStaleness",
     "placement: disaggregated"),
    ({"algorithm": {"miniBatches": 16}, "batch": {"minPrompts": 8}}, "spec.algorithm.miniBatches",
     "miniBatches <= 8"),
    ({"lora": {"targetModules": ["all-linear", "q_proj"]}}, "spec.lora.targetModules", "all-linear alone"),
    ({"lora": {"rank": 12}}, "spec.lora.rank", "use one of 1, 8, 16"),
    ({"lora": {}, "learner": {"zeroStage": 3}}, "spec.learner.zeroStage", "use zeroStage 0-2 with spec.lora"),
    ({"algorithm": {"dynamicSampling": {"maxRounds": 8}}}, "spec.algorithm.dynamicSampling.maxRounds",
     "enabled: true"),
    ({"optimizer": {"betas": [0.9, 1.0]}}, "spec.optimizer.betas", "[0.9, 0.999]"),
    ({"optimizer": {"lrSchedule": "cosine", "warmupSteps": 10}, "budget": {"maxSteps": 10}},
     "spec.optimizer.decaySteps", "set decaySteps above 10"),
    ({"optimizer": {"decaySteps": 100}}, "spec.optimizer.decaySteps", "lrSchedule: linear or cosine"),
    ({"model": {"path": "builtin:huge"}}, "spec.model.path", "builtin:tiny-arith"),
    ({"task": {"name": "builtin:chess"}}, "spec.task.name", "builtin:arithmetic"),
    ({"task": {"reward": "my reward"}}, "spec.task.reward", "module:function"),
    ({"task": {"name": "gsm8k"}}, "spec.task.name", "set task.dataset"),
    ({"task": {"dataset": "d.jsonl", "name": "builtin:arithmetic"}}, "spec.task.name", "leave name unset"),
    ({"task": {"dataset": "d.jsonl", "promptField": "q", "messagesField": "m"}}, "spec.task.promptField", "keep one"),
    ({"task": {"dataset": "d.jsonl", "messagesField": "m", "chat": False}}, "spec.task.chat", "leave chat unset"),
    ({"task": {"evalSplit": "test"}}, "spec.task.evalSplit", "set task.dataset"),
    ({"task": {"pluginVolume": {"configMap": {"name": "r"}}}}, "spec.task.pluginVolume", "remove task.pluginVolume"),
    ({"task": {"reward": "0.5*reward-model + 0.5*exact-match"}}, "spec.task.reward", "set task.rewardModel"),
    ({"hardware": {"accelerator": "cpu"}, "task": {"rewardModel": {"path": "/m"}}}, "spec.task.rewardModel",
     "remove task.rewardModel"),
    ({"task": {"reward": "reward-model", "rewardModel": {"path": "/m"}}}, "spec.task.rewardModel",
     "hardware.accelerator: cpu"),
    ({"hardware": {"accelerator": "cpu"}, "task": {"reward": "reward-model",
                                                   "rewardModel": {"path": "/m", "gpusPerReplica": 1}}},
     "spec.task.rewardModel.gpusPerReplica", "remove gpusPerReplica"),
    ({"task": {"tools": [{"name": "c", "builtin": "calculator", "function": "m:f"}]}}, "spec.task.tools",
     "set builtin: calculator or python"),
    ({"task": {"tools": [{"name": "c", "builtin": "calculator"}, {"name": "c", "builtin": "python"}]}},
     "spec.task.tools", "its own name"),
    ({"task": {"maxTurns": 3}}, "spec.task.maxTurns", "add task.tools"),
    ({"task": {"tools": [{"name": "c", "builtin": "calculator"}], "environment": "m:Env"}}, "spec.task.environment",
     "drop task.tools"),
    ({"task": {"tools": [{"name": "c", "builtin": "calculator"}], "maxNewTokens": 8, "maxTrajectoryTokens": 4}},
     "spec.task.maxTrajectoryTokens", "at least task.maxNewTokens"),
    ({"task": {"toolSandbox": {"isolation": "pod"}}}, "spec.task.toolSandbox", "remove task.toolSandbox"),
    ({"task": {"tools": [{"name": "c", "builtin": "calculator"}], "toolSandbox": {"runtimeClassName": "gvisor"}}},
     "spec.task.toolSandbox.runtimeClassName", "isolation: pod"),
    ({"task": {"tools": [{"name": "c", "builtin": "calculator"}], "toolSandbox": {"isolation": "process",
                                                                                "replicas": 2}}},
     "spec.task.toolSandbox.replicas", "isolation: pod"),
    ({"task": {"tools": [{"name": "c", "builtin": "calculator"}], "turnCredit": "rewardToGo"}}, "spec.task.turnCredit",
     "set task.environment"),
    ({"task": {"environment": "m:Env", "turnCredit": "rewardToGo"}, "algorithm": {"name": "gspo"}},
     "spec.task.turnCredit", "use algorithm.name grpo"),
    ({"task": {"environment": "m:Env", "turnDiscount": 0.9}}, "spec.task.turnDiscount", "set task.turnCredit"),
    ({"task": {"environment": "m:Env", "turnCredit": "rewardToGo", "turnDiscount": 0.9},
      "algorithm": {"name": "reinforce++"}}, "spec.task.turnDiscount", "set algorithm.gamma"),
    ({"task": {"overtakeTurns": True}}, "spec.task.overtakeTurns", "raise task.maxTurns"),
    ({"learner": {"pod": {"env": [{"name": "RLSCALE_PLUGINS", "value": "/x"}]}}}, "spec.learner.pod.env",
     "choose another name"),
    ({"learner": {"pod": {"env": [{"name": "WORLD_SIZE", "value": "3"}]}}}, "spec.learner.pod.env",
     "choose another name"),
    ({"rollout": {"pod": {"env": [{"name": "RAY_AUTH_TOKEN", "value": "x"}]}}}, "spec.rollout.pod.env",
     "choose another name"),
    ({"learner": {"pod": {"volumes": [{"name": "shm", "emptyDir": {}}]}}}, "spec.learner.pod.volumes",
     "taken: run-config"),
    ({"rollout": {"pod": {"volumes": [{"name": "data", "emptyDir": {}}],
                          "volumeMounts": [{"name": "datta", "mountPath": "/data"}]}}},
     "spec.rollout.pod.volumeMounts", "mount one of: data"),
    ({"rollout": {"pod": {"volumes": [{"name": "data"}]}}}, "spec.rollout.pod.volumes", "exactly one volume source"),
    ({"model": {"volume": {"hostPath": {"path": "/models"}}}}, "spec.model.volume",
     "persistentVolumeClaim bound by your admin"),
    ({"checkpoint": {"volume": {"nfs": {"server": "s", "path": "/"}}}}, "spec.checkpoint.volume",
     "persistentVolumeClaim bound by your admin"),
    ({"learner": {"pod": {"volumes": [{"name": "data", "emptyDir": {}}],
                          "volumeMounts": [{"name": "data", "mountPath": "/dev/shm"}]}}},
     "spec.learner.pod.volumeMounts", "mount it elsewhere"),
    ({"rollout": {"pod": {"labels": {"rlscale.dev/role": "learner"}}}}, "spec.rollout.pod.labels", "reserved:"),
    ({"learner": {"pod": {"labels": {"kueue.x-k8s.io/queue-name": "q"}}}}, "spec.learner.pod.labels", "reserved:"),
    ({"rollout": {"pod": {"annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}}}},
     "spec.rollout.pod.annotations", "reserved:"),
    ({"learner": {"pod": {"annotations": {"-bad": "x"}}}}, "spec.learner.pod.annotations", "e.g. example.com/team"),
    ({"rollout": {"pod": {"nodeSelector": {"a/b/c": "x"}}}}, "spec.rollout.pod.nodeSelector", "e.g. example.com"),
    ({"learner": {"pod": {"nodeSelector": {"x" * 64: "y"}}}}, "spec.learner.pod.nodeSelector", "e.g. example.com"),
    ({"checkpoint": {"path": "ckpt"}}, "spec.checkpoint.path", "absolute path such as /checkpoints"),
    ({"rollout": {"resources": {"limits": {"nvidia.com/gpu": 8}}}}, "spec.rollout.resources",
     "set rollout.gpusPerReplica"),
    ({"learner": {"resources": {"claims": [{"name": "gpu"}]}}}, "spec.learner.resources", "only requests and limits"),
    ({"rollout": {"pod": {"imagePullSecrets": ["r-ray-token"]}}}, "spec.rollout.pod.imagePullSecrets",
     "a pull secret of your own"),
    ({"learner": {"pod": {"imagePullSecrets": ["other-ray-token"]}}}, "spec.learner.pod.imagePullSecrets",
     "a pull secret of your own"),
    ({"checkpoint": {"keep": 1}}, "spec.checkpoint.keep", "name a shared checkpoint.volume"),
]


@pytest.mark.parametrize("spec,field,fix", CROSS_FIELD, ids=[c[1] + str(i) for i, c in enumerate(CROSS_FIELD)])
def test_cross_field_rule_names_field_and_fix(spec, field, fix):
    errs = errors_of(spec)
    # A rule over a list names the entry (spec.learner.pod.env[0].name), one over a volume
    # source the source (spec.model.volume.hostPath).
    hit = [e for e in errs if e.startswith((field + ":", field + "[", field + "."))]
    assert hit, errs
    assert fix in hit[0], hit[0]


def test_every_rule_is_exercised():
    named = {c[1] for c in CROSS_FIELD}
    assert {"spec." + r.path for r in RULES} - named - {"spec.learner.replicas"} <= named


def test_cpu_accelerator_lifts_the_gpu_rules():
    s = parse_spec({"hardware": {"accelerator": "cpu"}, "budget": {"gpus": 0}, "rollout": {"gpusPerReplica": 0}})
    assert s.hardware.accelerator == "cpu"


def test_the_algorithm_family_validates_with_its_knobs():
    cpu = {"hardware": {"accelerator": "cpu"}}
    for name in ("grpo", "ppo", "rloo", "reinforce++", "reinforce++-baseline", "gspo"):
        assert parse_spec({**cpu, "algorithm": {"name": name}}).algorithm.name == name
    s = parse_spec({**cpu, "algorithm": {"name": "grpo", "klCoef": 0.01, "klEstimator": "k2", "entropyCoef": 0.001,
                                         "lossAggregation": "seq-mean-token-sum-norm", "stdNormalize": False,
                                         "dropUniformGroups": False, "maskTruncatedCompletions": True,
                                         "overlongBuffer": {"length": 4, "penaltyFactor": 0.5},
                                         "dynamicSampling": {"enabled": True, "maxRounds": 8}}})
    a = s.algorithm
    assert (a.kl_estimator, a.entropy_coef, a.overlong_buffer.length, a.dynamic_sampling.max_rounds) == ("k2", 0.001,
                                                                                                           4, 8)
    assert parse_spec({**cpu, "algorithm": {"name": "ppo", "valueClip": 0}}).algorithm.value_clip == 0
    assert parse_spec({**cpu, "algorithm": {"name": "reinforce++", "gamma": 0.99}}).algorithm.gamma == 0.99
    # lossAggregation unset: GSPO's paper averages over sequences; the rest default to verl's token-mean.
    assert parse_spec({**cpu, "algorithm": {"name": "gspo"}}).algorithm.resolved_loss_aggregation() == \
        "seq-mean-token-mean"
    assert parse_spec(cpu).algorithm.resolved_loss_aggregation() == "token-mean"
    # The run config and the operator carry the spec as its dict: the new fields survive the trip.
    again = parse_rlrun(yaml.safe_load(yaml.safe_dump(parse_rlrun(rlrun_dict({**cpu, "algorithm": {
        "name": "rloo", "overlongBuffer": {"length": 2}, "dynamicSampling": {"enabled": True}}})).to_dict())))
    assert again.spec.algorithm.overlong_buffer.length == 2 and again.spec.algorithm.dynamic_sampling.enabled


def test_ppo_allows_one_sample_per_prompt():
    assert parse_spec({"hardware": {"accelerator": "cpu"}, "algorithm": {"name": "ppo"},
                       "batch": {"samplesPerPrompt": 1}}).batch.samples_per_prompt == 1


STRUCTURAL = [
    ({"batch": {"prompts": 0}}, 'spec.batch.prompts: 0 is not allowed; use a positive integer or "auto"'),
    ({"batch": {"prompts": "lots"}}, "spec.batch.prompts: 'lots' is not allowed"),
    ({"batch": {"prompts": True}}, "spec.batch.prompts: true is not allowed"),
    ({"rollout": {"replicas": 0}}, "suspend: true scales to zero"),
    ({"batch": {"promts": 8}}, "spec.batch.promts: is not a known field; did you mean 'prompts'?"),
    ({"optimizer": {"lr": -1e-5}}, "spec.optimizer.lr: -1e-05 must be greater than 0"),
    ({"optimizer": {"lr": 0}}, "spec.optimizer.lr: 0 must be greater than 0"),
    ({"algorithm": {"clipRatio": 0}}, "spec.algorithm.clipRatio: 0 must be greater than 0"),
    ({"algorithm": {"name": "dpo"}}, "spec.algorithm.name: 'dpo' is not allowed; use 'grpo', 'ppo', 'rloo', "
     "'reinforce++', 'reinforce++-baseline' or 'gspo'"),
    ({"algorithm": {"lossAggregation": "seq-mean"}}, "spec.algorithm.lossAggregation: 'seq-mean' is not allowed; use "
     "'token-mean', 'seq-mean-token-mean' or 'seq-mean-token-sum-norm'"),
    ({"algorithm": {"klEstimator": "low_var_kl"}}, "spec.algorithm.klEstimator: 'low_var_kl' is not allowed; use "
     "'k1', 'k2' or 'k3'"),
    ({"algorithm": {"entropyCoef": -0.1}}, "spec.algorithm.entropyCoef: -0.1 must be greater than or equal to 0"),
    ({"algorithm": {"valueClip": -1}}, "spec.algorithm.valueClip: -1 must be greater than or equal to 0"),
    ({"algorithm": {"overlongBuffer": {}}}, "spec.algorithm.overlongBuffer.length: is required"),
    ({"algorithm": {"dynamicSampling": {"maxRounds": 0}}}, "spec.algorithm.dynamicSampling.maxRounds: 0 must be "
     "greater than 0"),
    ({"learner": {"zeroStage": 4}}, "spec.learner.zeroStage: 4 must be less than or equal to 3"),
    ({"lora": {"targetModules": ["q proj"]}}, "module name 'q proj' is not a module name (letters, digits, _ and .); "
     "use peft's names, e.g. q_proj"),
    ({"lora": {"dropout": 1.0}}, "spec.lora.dropout: 1.0 must be less than 1"),
    ({"learner": {"zeroStage": -1}}, "spec.learner.zeroStage: -1 must be greater than or equal to 0"),
    ({"hardware": {"accelerator": "TPU"}}, "spec.hardware.accelerator: 'TPU' is not allowed"),
    ({"model": {"dtype": "int4"}}, "spec.model.dtype: 'int4' is not allowed"),
    ({"batch": {"microBatch": 0}}, "spec.batch.microBatch: 0 must be greater than 0"),
    ({"model": "gpt"}, "spec.model: 'gpt' must be a mapping"),
    ({"optimizer": {"betas": [0.9]}}, "spec.optimizer.betas[1]: is required"),
]


@pytest.mark.parametrize("spec,message", STRUCTURAL, ids=[m for _, m in STRUCTURAL])
def test_structural_errors_are_one_clear_line(spec, message):
    errs = errors_of(spec)
    assert any(message in e for e in errs), errs
    assert all("\n" not in e and "Traceback" not in e for e in errs)


def test_all_problems_are_reported_together():
    errs = errors_of({"batch": {"prompts": 0}, "optimizer": {"lr": -1}, "model": {"dtype": "x"}})
    assert len(errs) == 3


@pytest.mark.parametrize(
    "text,needle",
    [
        ("", "is empty"),
        ("# only a comment\n", "is empty"),
        ("spec: [unclosed\n", "is not valid YAML at line"),
        ("- a\n- b\n", "is a list, not a mapping"),
        ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", "apiVersion: 'v1' is not supported"),
        ("apiVersion: rlscale.dev/v1alpha1\nkind: RLJob\nmetadata: {name: p}\n", "kind: 'RLJob' is not an RLRun"),
        ("apiVersion: rlscale.dev/v1alpha1\nkind: RLRun\n", "metadata: is required"),
        ("apiVersion: rlscale.dev/v1alpha1\nkind: RLRun\nmetadata: {name: Bad_Name}\n", "is not a valid RLRun name"),
        ("a: 1\n---\nb: 2\n", "put one RLRun per file"),
        ("\tkey: value\n", "is not valid YAML"),
    ],
)
def test_bad_files_get_one_line(tmp_path, text, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(SpecError) as info:
        load_rlrun(f)
    assert needle in str(info.value), str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_rlrun(tmp_path / "nope.yaml")


def test_round_trip_through_yaml_keeps_the_spec():
    r = parse_rlrun(rlrun_dict({"model": {"path": "Qwen/Qwen2.5-7B"}, "batch": {"prompts": 16},
                                "algorithm": {"name": "ppo", "lambda": 0.9}}))
    again = parse_rlrun(yaml.safe_load(yaml.safe_dump(r.to_dict())))
    assert again.spec == r.spec and again.to_dict()["spec"]["algorithm"]["lambda"] == 0.9


yaml_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False),
                         st.text(max_size=8))
yaml_values = st.recursive(
    yaml_scalars,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.text(max_size=12), children, max_size=5)),
    max_leaves=20,
)
spec_keys = st.sampled_from(["model", "algorithm", "task", "target", "batch", "optimizer", "budget", "rollout",
                             "learner", "hardware", "checkpoint", "suspend", "prompts", "samplesPerPrompt", "lr"])
spec_like = st.dictionaries(spec_keys, st.one_of(yaml_values, st.dictionaries(spec_keys, yaml_values, max_size=4)),
                            max_size=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=st.one_of(yaml_values, spec_like.map(rlrun_dict)))
def test_arbitrary_yaml_only_ever_gives_validation_errors(doc):
    try:
        parse_rlrun(doc)
    except SpecError as exc:
        assert exc.errors and all(str(e) for e in exc.errors)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_arbitrary_text_files_only_ever_give_validation_errors(tmp_path_factory, text):
    f = tmp_path_factory.mktemp("y") / "x.yaml"
    f.write_text(text, encoding="utf-8")
    try:
        load_rlrun(f)
    except SpecError as exc:
        assert exc.errors


@pytest.mark.parametrize("name,problem", [
    ("quick.start", "not a valid RLRun name"),
    ("1quick", "not a valid RLRun name"),
    ("a" * 64, "longer than 63"),
])
def test_rlrun_name_must_fit_its_services_and_labels(name, problem):
    with pytest.raises(SpecError) as e:
        parse_rlrun({"apiVersion": "rlscale.dev/v1alpha1", "kind": "RLRun", "metadata": {"name": name}})
    assert str(e.value).startswith("metadata.name: ") and problem in str(e.value), str(e.value)
    assert "starting with a letter" in str(e.value) or "at most 63" in str(e.value)


def test_pod_overrides_parse_into_kubernetes_field_names():
    s = parse_spec({"model": {"path": "Qwen/Qwen2.5-7B"}, "learner": {"pod": {
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {"pool": "h100"}, "imagePullSecrets": ["regcred"],
        "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}]}}})
    pod = s.learner.pod
    assert pod.volumes[0].model_dump(by_alias=True) == {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}
    assert pod.volume_mounts[0].model_dump(by_alias=True, exclude_none=True) == {"name": "data", "mountPath": "/data",
                                                                                 "readOnly": True}
    assert pod.env[0].model_dump(by_alias=True, exclude_none=True) == {"name": "NCCL_DEBUG", "value": "INFO"}
