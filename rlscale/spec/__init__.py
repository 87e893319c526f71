"""The RLRun spec: the one schema that the CLI, the CRD, the planner and the operator share.

models.py holds the fields (algorithm.py those of spec.algorithm), rules.py the cross-field rules
(also emitted as CEL into the CRD), errors.py what a bad spec is told; this module parses and
re-exports them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rlscale.spec.algorithm import (  # noqa: F401  (re-exported)
    ALGORITHMS,
    GROUP_ALGORITHMS,
    KL_ESTIMATORS,
    KL_IN_REWARD,
    LOSS_AGGREGATIONS,
    DynamicSamplingSpec,
    OverlongBufferSpec,
    default_loss_aggregation,
)
from rlscale.spec.errors import MISSING, FieldError, SpecError, translate, union_fix
from rlscale.spec.models import (  # noqa: F401  (re-exported: the spec's names are rlscale.spec.X)
    ACCELERATORS,
    API_GROUP,
    API_VERSION,
    BUILTIN_MODELS,
    BUILTIN_REWARDS,
    BUILTIN_TASKS,
    DNS1123_RE,
    ENV_NAME_RE,
    FULL_API_VERSION,
    KIND,
    MAX_PROMPTS,
    MAX_REPLICAS,
    MAX_SAMPLES_PER_PROMPT,
    PLUGIN_REWARD_RE,
    PLUGINS_ENV,
    PLUGINS_MOUNT,
    PROJECTED_SOURCES,
    RAY_TOKEN_SECRET_SUFFIX,
    RESERVED_ENV,
    RESERVED_MOUNTS,
    RESERVED_VOLUMES,
    REWARD_EXPRESSION_RE,
    REWARD_MODEL_TERM,
    RLRUN_NAME_MAX,
    RLRUN_NAME_RE,
    VALUE_FROM_KINDS,
    VOLUME_SOURCES,
    AlgorithmSpec,
    Auto,
    BatchSpec,
    BudgetSpec,
    CheckpointSpec,
    EnvVar,
    ExtraVolume,
    FailurePolicySpec,
    HardwareSpec,
    LearnerSpec,
    Metadata,
    ModelShapeSpec,
    ModelSpec,
    OptimizerSpec,
    PodOverrides,
    PosInt,
    RewardModelSpec,
    RLRun,
    RLRunSpec,
    RolloutSpec,
    SchedulingSpec,
    TargetSpec,
    TaskSpec,
    ValueFrom,
    VolumeMount,
    VolumeSource,
)
from rlscale.spec.rules import check_rules
from rlscale.spec.syntax import number_problems

# YAML aliases one spec file may use. Each alias is a reference, not a copy, until something walks the
# tree (the checks below, a JSON dump): nine levels of ten aliases each are 10^9 nodes from a few hundred
# bytes. A spec that shares a tolerations block between its roles needs a handful.
MAX_YAML_ALIASES = 16


class _BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a document with more than MAX_YAML_ALIASES aliases."""

    aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_YAML_ALIASES:
                raise yaml.composer.ComposerError(None, None, f"has more than {MAX_YAML_ALIASES} aliases (*name); "
                                                  "write the repeated blocks out", self.peek_event().start_mark)
        return super().compose_node(parent, index)


def safe_load_all(text: str) -> list[Any]:
    """yaml.safe_load_all with an alias budget (MAX_YAML_ALIASES): every file a spec comes from is read so."""
    loader = _BoundedLoader(text)
    try:
        docs = []
        while loader.check_data():
            docs.append(loader.get_data())
        return docs
    finally:
        loader.dispose()


def parse_spec(data: Any, root: str = "spec") -> RLRunSpec:
    """Validate a spec mapping (structure, then cross-field rules); raises SpecError."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError([FieldError(root, data, "must be a mapping", "see examples/quickstart.yaml")])
    # Anywhere in the spec, open maps (resources, affinity, volume sources) included.
    numbers = [FieldError(path, value, problem, "use a finite number within the field's range")
               for path, value, problem in number_problems(data, root)]
    if numbers:
        raise SpecError(numbers)
    try:
        spec = RLRunSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(union_fix(translate(exc, RLRunSpec, root))) from None
    errors = check_rules(spec)
    if errors:
        raise SpecError(errors)
    return spec


def parse_rlrun(data: Any) -> RLRun:
    """Validate a whole RLRun object (already parsed from YAML); raises SpecError."""
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}, not a mapping"
        raise SpecError([FieldError("(document)", MISSING, f"is {kind}", "write an RLRun object: apiVersion: "
                                    f"{FULL_API_VERSION}, kind: {KIND}, metadata, spec")])
    head: list[FieldError] = []
    if data.get("apiVersion") != FULL_API_VERSION:
        head.append(FieldError("apiVersion", data.get("apiVersion", MISSING),
                               "is not supported" if "apiVersion" in data else "is required",
                               f"use apiVersion: {FULL_API_VERSION}"))
    if data.get("kind") != KIND:
        head.append(FieldError("kind", data.get("kind", MISSING), "is not an RLRun" if "kind" in data else
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
        raise SpecError(translate(exc, RLRun, "") + spec_errors) from None
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
        missing = FieldError(str(p), MISSING, "does not exist", "give the path of an RLRun YAML file")
        raise SpecError([missing]) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise SpecError([FieldError(str(p), MISSING, f"cannot be read ({exc.__class__.__name__})",
                                    "give a readable UTF-8 YAML file")]) from None
    try:
        docs = [d for d in safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "is not valid YAML"
        invalid = FieldError(str(p), MISSING, f"is not valid YAML{where}: {problem}", "fix the YAML syntax")
        raise SpecError([invalid]) from None
    if not docs:
        raise SpecError([FieldError(str(p), MISSING, "is empty", "write an RLRun object (apiVersion: "
                                    f"{FULL_API_VERSION}, kind: {KIND})")])
    if len(docs) > 1:
        raise SpecError([FieldError(str(p), MISSING, f"holds {len(docs)} YAML documents", "put one RLRun per file")])
    return parse_rlrun(docs[0])
