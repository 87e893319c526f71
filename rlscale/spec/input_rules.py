"""Rules on the syntax of what an RLRun hands to Kubernetes (label and annotation keys, container paths, the
env's size), checked in Python and emitted as CEL like rules.py's: what passes them the API server takes for
the run's pods, and none of it reaches what the operator or Kubernetes' own controllers own."""

from __future__ import annotations

from rlscale.spec.models import RAY_TOKEN_SECRET_SUFFIX, RESERVED_MOUNTS, RLRunSpec
from rlscale.spec.rule_base import Rule, _cel_list, _err
from rlscale.spec.syntax import (
    DNS_LABEL_MAX,
    DNS_SUBDOMAIN_MAX,
    DOT_SEGMENT_RE,
    ENV_TOTAL_MAX,
    NORMAL_PATH_RE,
    QUALIFIED_KEY_RE,
    RESERVED_KEY_DOMAINS,
    SYSTEM_PATHS,
    key_problem,
    path_problem,
    reserved_key,
    under,
)

_RESERVED_FIX = "use a key of your own domain (reserved: " + ", ".join(RESERVED_KEY_DOMAINS) + " and their subdomains)"


def _cel_key_ok(k: str) -> str:
    # The name after the last "/" (all of it without one) at most 63, the prefix at most 253.
    return (f"{k}.matches('{QUALIFIED_KEY_RE}') && {k}.lastIndexOf('/') <= {DNS_SUBDOMAIN_MAX} && "
            f"size({k}) - {k}.lastIndexOf('/') - 1 <= {DNS_LABEL_MAX}")


def _cel_key_free(k: str) -> str:
    prefix = f"{k}.substring(0, {k}.lastIndexOf('/') < 0 ? 0 : {k}.lastIndexOf('/'))"
    return f"!{_cel_list(RESERVED_KEY_DOMAINS)}.exists(d, {prefix} == d || {prefix}.endsWith('.' + d))"


def _rule_keys(role: str, what: str, reserved: bool):
    attr = {"nodeSelector": "node_selector"}.get(what, what)

    def check(s: RLRunSpec):
        for key in getattr(getattr(s, role).pod, attr):
            path = f"{role}.pod.{what}.{key}" if "/" not in key and "." not in key else f"{role}.pod.{what}[{key!r}]"
            if problem := key_problem(key):
                return _err(path, key, problem, "e.g. example.com/team")
            if reserved and reserved_key(key):
                return _err(path, key, "is under a prefix the operator or Kubernetes' controllers act on",
                            _RESERVED_FIX)
    return check


def _key_rules(role: str) -> list[Rule]:
    out = []
    for what, reserved in (("labels", True), ("annotations", True), ("nodeSelector", False)):
        x = f"self.{role}.pod.{what}"
        cel = f"!has({x}) || {x}.all(k, {_cel_key_ok('k')}" + (f" && {_cel_key_free('k')}" if reserved else "") + ")"
        message = (f"{role}.pod.{what} keys must be valid label keys (an optional DNS subdomain prefix and '/', then "
                   "at most 63 characters)" + (" under none of " + ", ".join(RESERVED_KEY_DOMAINS) if reserved else ""))
        out.append(Rule(f"{role}.pod.{what}", cel, message, _rule_keys(role, what, reserved)))
    return out


def _rule_mount_paths(role: str):
    def check(s: RLRunSpec):
        for i, m in enumerate(getattr(s, role).pod.volume_mounts):
            path = f"{role}.pod.volumeMounts[{i}]"
            if problem := path_problem(m.mount_path):
                return _err(path + ".mountPath", m.mount_path, problem, "write it as /data/cache")
            if taken := under(m.mount_path, RESERVED_MOUNTS):
                return _err(path + ".mountPath", m.mount_path, f"is at or under {taken}, which the operator mounts "
                            "itself", "mount it elsewhere (taken: " + ", ".join(RESERVED_MOUNTS) + ")")
            if m.sub_path is not None and ".." in m.sub_path.split("/"):
                return _err(path + ".subPath", m.sub_path, "climbs out of the volume ('..')", "use a path within it")
    return check


def _cel_path_ok(p: str) -> str:
    return f"{p}.matches('{NORMAL_PATH_RE}') && !{p}.matches('{DOT_SEGMENT_RE}')"


def _cel_not_under(p: str, roots: tuple[str, ...]) -> str:
    return f"!{_cel_list(roots)}.exists(r, {p} == r || {p}.startsWith(r + '/'))"


def _mount_rule(role: str) -> Rule:
    x = f"self.{role}.pod.volumeMounts"
    return Rule(f"{role}.pod.volumeMounts",
                f"!has({x}) || {x}.all(m, {_cel_path_ok('m.mountPath')} && "
                f"{_cel_not_under('m.mountPath', RESERVED_MOUNTS)} && "
                "(!has(m.subPath) || !m.subPath.matches('(^|/)[.][.](/|$)')))",
                f"each {role}.pod.volumeMounts mountPath must be absolute, in normal form, and not at or under a path "
                "the operator mounts (" + ", ".join(RESERVED_MOUNTS) + "); a subPath must not hold '..'",
                _rule_mount_paths(role))


_CHECKPOINT_TAKEN = tuple(sorted({*RESERVED_MOUNTS, *SYSTEM_PATHS}))


def _rule_checkpoint_path(s: RLRunSpec):
    p = s.checkpoint.path
    if problem := path_problem(p):
        return _err("checkpoint.path", p, problem, "use an absolute path such as /checkpoints")
    if taken := under(p, _CHECKPOINT_TAKEN):
        return _err("checkpoint.path", p, f"is at or under {taken}, a path the operator mounts or the system's own",
                    "use a directory of its own such as /checkpoints")


def _rule_keep(s: RLRunSpec):
    if s.checkpoint.volume is None and s.checkpoint.keep < 2:
        return _err("checkpoint.keep", s.checkpoint.keep, "is under 2 while each learner rank writes its own "
                    "volume (checkpoint.volume unset): a rank stopped while it writes would leave the ranks no "
                    "checkpoint in common", "keep 2 or more, or name a shared checkpoint.volume")


def env_bytes(s: RLRunSpec, role: str) -> int:
    """Characters of a role's extra env: every name and literal value, counted as CEL's size() counts them
    (code points; at most 4 bytes each in the ConfigMap, so both roles stay well under its 1 MiB)."""
    return sum(len(e.name) + len(e.value or "") for e in getattr(s, role).pod.env)


def _rule_env_total(role: str):
    def check(s: RLRunSpec):
        n = env_bytes(s, role)
        if n > ENV_TOTAL_MAX:
            return _err(f"{role}.pod.env", f"{n} characters", f"is larger than {ENV_TOTAL_MAX} characters in all "
                        "(names and values; the run's ConfigMap carries them, and holds at most 1 MiB)",
                        "pass large values through a ConfigMap or Secret (valueFrom) or a mounted volume")
    return check


def _rule_pull_secrets(role: str):
    def check(s: RLRunSpec):
        for i, name in enumerate(getattr(s, role).pod.image_pull_secrets):
            if name.endswith(RAY_TOKEN_SECRET_SUFFIX):
                return _err(f"{role}.pod.imagePullSecrets[{i}]", name, "names a run's Ray token Secret (the "
                            f"operator's *{RAY_TOKEN_SECRET_SUFFIX}), which would hand its token to the kubelet as "
                            "registry credentials", "name a pull secret of your own")
    return check


def _pull_rule(role: str) -> Rule:
    x = f"self.{role}.pod.imagePullSecrets"
    return Rule(f"{role}.pod.imagePullSecrets", f"!has({x}) || {x}.all(n, !n.endsWith('{RAY_TOKEN_SECRET_SUFFIX}'))",
                f"{role}.pod.imagePullSecrets must name no Secret *{RAY_TOKEN_SECRET_SUFFIX}", _rule_pull_secrets(role))


def input_rules() -> list[Rule]:
    """Keys, paths and sizes, for both roles and the checkpoint directory."""
    out: list[Rule] = [
        Rule("checkpoint.path", f"{_cel_path_ok('self.checkpoint.path')} && "
             f"{_cel_not_under('self.checkpoint.path', _CHECKPOINT_TAKEN)}",
             "checkpoint.path must be absolute, in normal form, and not at or under "
             + ", ".join(_CHECKPOINT_TAKEN), _rule_checkpoint_path),
        Rule("checkpoint.keep", "has(self.checkpoint.volume) || self.checkpoint.keep >= 2",
             "checkpoint.keep must be at least 2 unless checkpoint.volume is set (each rank writes its own)",
             _rule_keep),
    ]
    for role in ("rollout", "learner"):
        env = f"self.{role}.pod.env"
        out += [*_key_rules(role), _mount_rule(role), _pull_rule(role),
                Rule(f"{role}.pod.env", f"!has({env}) || {env}.map(e, size(e.name) + "
                     f"(has(e.value) ? size(e.value) : 0)).sum() <= {ENV_TOTAL_MAX}",
                     f"{role}.pod.env names and values must hold at most {ENV_TOTAL_MAX} characters in all",
                     _rule_env_total(role))]
    return out
