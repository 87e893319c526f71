"""The syntax and size bounds every RLRun field obeys, as constants the pydantic models (models.py), the
rules (input_rules.py) and the CRD (rlscale/crd.py) all read, so `validate` and admission refuse the same
specs. Regexes hold no backslash and are matched whole in Python (re.fullmatch), as CEL's RE2 matches
`^...$` (Python's `re.match` lets `$` match before a trailing newline; RE2 does not)."""

from __future__ import annotations

import math
import re
from typing import Any

# The largest integer a spec may hold: 2^53 - 1, the last one every JSON reader keeps exact (JSON numbers are
# doubles to many of them; the API server takes a CRD's `maximum` as one too, and refuses 2^63 - 1 there).
INT_MAX = 2**53 - 1

# Kubernetes object names: a DNS-1123 subdomain (Secrets, ConfigMaps, claims, PriorityClasses,
# RuntimeClasses, scheduler names) or a DNS-1123 label (volumes, Kueue LocalQueues).
_DNS_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN_RE = f"^{_DNS_LABEL}([.]{_DNS_LABEL})*$"
DNS_SUBDOMAIN_MAX = 253
DNS_LABEL_MAX = 63
# Label and annotation keys: an optional DNS-subdomain prefix and "/", then a name of at most 63
# characters; label values: at most 63 such characters, or empty.
_LABEL_NAME = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
QUALIFIED_KEY_RE = f"^({_DNS_LABEL}([.]{_DNS_LABEL})*/)?{_LABEL_NAME}$"
QUALIFIED_KEY_MAX = DNS_SUBDOMAIN_MAX + 1 + DNS_LABEL_MAX
LABEL_VALUE_RE = f"^({_LABEL_NAME})?$"
# Key prefixes the operator, Kubernetes and its SIGs' controllers (Kueue, the scheduler plug-ins) act on:
# a run's own pod labels or annotations under them could steer those controllers or the operator.
RESERVED_KEY_DOMAINS = ("rlscale.dev", "kubernetes.io", "k8s.io", "x-k8s.io")
# Pod labels and annotations a role may add, and the bytes of its annotation values together
# (the API server's own limit on all of an object's annotations is 256 KiB).
MAX_POD_LABELS = 32
MAX_POD_ANNOTATIONS = 32
ANNOTATION_VALUE_MAX = 4096
# A role's env: each literal value, and names plus values together. The run's ConfigMap carries the
# spec, and a ConfigMap holds at most 1 MiB.
ENV_VALUE_MAX = 32768
ENV_TOTAL_MAX = 65536
# A mount path or checkpoint path: absolute, in normal form (no ".", "..", "//" segments, no
# trailing "/"), so a prefix check against the operator's own paths means what it says.
NORMAL_PATH_RE = "^(/[^/]+)+$"
DOT_SEGMENT_RE = "(^|/)[.][.]?(/|$)"
# Where no checkpoint directory may go: the system's own directories (the container would not start, or
# a checkpoint would overwrite what the image runs from).
SYSTEM_PATHS = ("/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/var/run", "/run")
# Plausible accelerator figures: a number outside these is a typo (a bandwidth in GB/s where bytes/s
# are asked for), and a figure near zero makes the planner's times infinite.
BANDWIDTH_MIN, BANDWIDTH_MAX = 1.0e9, 1.0e15  # bytes/s: 1 GB/s .. 1 PB/s (an H200 has 4.8e12)
INTERCONNECT_MIN, INTERCONNECT_MAX = 1.0e6, 1.0e14  # bytes/s: 1 MB/s .. 100 TB/s
FLOPS_MIN, FLOPS_MAX = 1.0e9, 1.0e18  # FLOP/s: 1 GFLOP/s .. 1 EFLOP/s (an H100 has 9.89e14 in bf16)
MEMORY_MIN, MEMORY_MAX = float(2**28), float(2**46)  # bytes: 256 MiB .. 64 TiB
# GPUs one pod may ask for (gpusPerReplica): no node offers more.
MAX_GPUS_PER_POD = 16
# What a role's `resources` may request and limit: GPUs and every other device come through
# gpusPerReplica alone (extended resources such as nvidia.com/gpu would bypass budget.gpus and every
# GPU rule), and dynamic resource `claims` are not an RLRun's to make.
RESOURCE_NAMES = ("cpu", "memory", "ephemeral-storage")
RESOURCE_PREFIXES = ("hugepages-",)
# Resource names in one role's requests or limits (the CEL rule over them stays within the API server's
# cost budget only with a bound).
MAX_RESOURCE_NAMES = 8
# Planning hints: past these the planner's sums leave float range or mean nothing.
EXPECTED_SAMPLES_MAX = 1.0e15
NOISE_SCALE_MAX = 1.0e15
# Deadlines in seconds: a week for a pod to start, ten years for a run (past both a number means nothing).
POD_START_TIMEOUT_MAX = 7 * 24 * 3600
ACTIVE_DEADLINE_MAX = 10 * 365 * 24 * 3600


def full(pattern: str, text: str) -> bool:
    """Whether `text` matches `pattern` whole, as CEL's `matches` with ^...$ does."""
    return re.fullmatch(pattern, text) is not None


def reserved_key(key: str) -> bool:
    """Whether a label or annotation key's prefix is one of RESERVED_KEY_DOMAINS or under one."""
    prefix = key.rpartition("/")[0]
    return any(prefix == d or prefix.endswith("." + d) for d in RESERVED_KEY_DOMAINS)


def key_problem(key: str) -> str | None:
    """Why a label or annotation key is not valid Kubernetes syntax, or None."""
    prefix, _, name = key.rpartition("/")
    if len(prefix) > DNS_SUBDOMAIN_MAX or len(name) > DNS_LABEL_MAX or not full(QUALIFIED_KEY_RE, key):
        return ("is not a valid label or annotation key (an optional DNS subdomain prefix of at most 253 characters "
                "and '/', then at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or "
                "digit)")
    return None


def path_problem(path: str) -> str | None:
    """Why a container path is not absolute and in normal form, or None."""
    if not path.startswith("/"):
        return "is not an absolute path"
    if not full(NORMAL_PATH_RE, path) or re.search(DOT_SEGMENT_RE, path):
        return "is not in normal form (no '.', '..' or empty segments, no trailing '/', not '/' itself)"
    return None


def under(path: str, roots: tuple[str, ...]) -> str | None:
    """The first of `roots` that `path` is or lies under, or None."""
    return next((r for r in roots if path == r or path.startswith(r + "/")), None)


def number_problems(data: Any, path: str) -> list[tuple[str, Any, str]]:
    """(path, value, problem) of every non-finite float and every integer past INT_MAX anywhere in a parsed
    YAML/JSON tree: the API server cannot store the first nor keep the second exact, and the planner's
    arithmetic breaks on them."""
    out: list[tuple[str, Any, str]] = []
    if isinstance(data, bool):
        return out
    if isinstance(data, float) and not math.isfinite(data):
        out.append((path, data, "is not a finite number"))
    elif isinstance(data, int) and not -INT_MAX <= data <= INT_MAX:
        out.append((path, data, f"is past the integers a spec may hold (magnitude at most 2^53 - 1 = {INT_MAX})"))
    elif isinstance(data, dict):
        for k, v in data.items():
            out += number_problems(v, f"{path}.{k}")
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += number_problems(v, f"{path}[{i}]")
    return out
