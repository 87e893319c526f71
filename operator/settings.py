"""The operator's settings: read once from the environment (the chart's Deployment sets it) and passed
down, so no module reads the environment on import or in a handler."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from .builders import Images
from .policy import Policy
from .profiles import parse_profiles

# The variables the chart's Deployment (charts/rlscale/templates/deployment.yaml) and the tests set.
ENV_TRAINER_IMAGE = "RLSCALE_TRAINER_IMAGE"
ENV_ROLLOUT_IMAGE = "RLSCALE_ROLLOUT_IMAGE"
ENV_CHECKPOINT_STORAGE = "RLSCALE_CHECKPOINT_STORAGE"
# The chart's networkPolicy values: a NetworkPolicy per run (true/false), and the namespaces
# (comma-separated names) whose pods may scrape the runs' metrics port.
ENV_NETWORK_POLICY = "RLSCALE_NETWORK_POLICY"
ENV_METRICS_FROM = "RLSCALE_METRICS_FROM"
# The chart's networkPolicy.egress (restricted or open) and networkPolicy.egressCIDRs (comma-separated).
ENV_EGRESS = "RLSCALE_NETWORK_EGRESS"
ENV_EGRESS_CIDRS = "RLSCALE_EGRESS_CIDRS"
ENV_PROGRESS_INTERVAL = "RLSCALE_PROGRESS_INTERVAL"
ENV_LOG_LEVEL = "RLSCALE_LOG_LEVEL"
ENV_KOPF_LOG_LEVEL = "RLSCALE_KOPF_LOG_LEVEL"
ENV_BIND = "RLSCALE_OPERATOR_BIND"
ENV_HEALTH = "RLSCALE_OPERATOR_HEALTH"
ENV_WORKERS = "RLSCALE_OPERATOR_WORKERS"
ENV_STEP_DELAY = "RLSCALE_OPERATOR_STEP_DELAY"
ENV_KUBECONFIG = "KUBECONFIG"
# Leader election (the chart sets these when it runs more than one replica): the Lease as
# <namespace>/<name> ("" = no election, this process reconciles at once), this replica's name in it
# (the pod's name), and the lease duration in seconds.
ENV_LEASE = "RLSCALE_OPERATOR_LEASE"
ENV_IDENTITY = "RLSCALE_OPERATOR_IDENTITY"
ENV_LEASE_SECONDS = "RLSCALE_OPERATOR_LEASE_SECONDS"
# The chart's policy values (operator/policy.py): allowlists, comma-separated, where empty allows none, of
# what a run may use (image prefixes, runtime, priority and scheduler names, toleration keys, node label
# keys, Secrets and claims), and whether a run's namespace must carry a Pod Security enforce label.
ENV_IMAGE_PREFIXES = "RLSCALE_IMAGE_PREFIXES"
ENV_RUNTIME_CLASSES = "RLSCALE_RUNTIME_CLASS_NAMES"
ENV_PRIORITY_CLASSES = "RLSCALE_PRIORITY_CLASS_NAMES"
ENV_SCHEDULERS = "RLSCALE_SCHEDULER_NAMES"
ENV_TOLERATION_KEYS = "RLSCALE_TOLERATION_KEYS"
ENV_NODE_LABEL_KEYS = "RLSCALE_NODE_LABEL_KEYS"
ENV_SECRET_NAMES = "RLSCALE_SECRET_NAMES"
ENV_CLAIM_NAMES = "RLSCALE_CLAIM_NAMES"
ENV_REQUIRE_POD_SECURITY = "RLSCALE_REQUIRE_POD_SECURITY"
ENV_ALLOW_BLOCKING_EVICTIONS = "RLSCALE_ALLOW_BLOCKING_EVICTIONS"  # true/false
ENV_SECRET_LABEL = "RLSCALE_SECRET_LABEL"  # key=value or key: Secrets allowed by label
ENV_CLAIM_LABEL = "RLSCALE_CLAIM_LABEL"  # the same for PersistentVolumeClaims
# policy.placementProfiles as JSON (the chart's toJson; operator/profiles.py) and policy.requirePlacementProfile.
ENV_PLACEMENT_PROFILES = "RLSCALE_PLACEMENT_PROFILES"
ENV_REQUIRE_PLACEMENT_PROFILE = "RLSCALE_REQUIRE_PLACEMENT_PROFILE"  # true/false
POLICY_ENV = {"image_prefixes": ENV_IMAGE_PREFIXES, "runtime_class_names": ENV_RUNTIME_CLASSES,
              "priority_class_names": ENV_PRIORITY_CLASSES, "scheduler_names": ENV_SCHEDULERS,
              "toleration_keys": ENV_TOLERATION_KEYS, "node_label_keys": ENV_NODE_LABEL_KEYS,
              "secret_names": ENV_SECRET_NAMES, "claim_names": ENV_CLAIM_NAMES}
ENV_NAMES = (ENV_TRAINER_IMAGE, ENV_ROLLOUT_IMAGE, ENV_CHECKPOINT_STORAGE, ENV_NETWORK_POLICY, ENV_METRICS_FROM,
             ENV_PROGRESS_INTERVAL, ENV_LOG_LEVEL, ENV_KOPF_LOG_LEVEL, ENV_BIND, ENV_HEALTH, ENV_WORKERS,
             ENV_STEP_DELAY, ENV_KUBECONFIG, *POLICY_ENV.values(), ENV_REQUIRE_POD_SECURITY, ENV_LEASE, ENV_IDENTITY,
             ENV_LEASE_SECONDS, ENV_ALLOW_BLOCKING_EVICTIONS, ENV_EGRESS, ENV_EGRESS_CIDRS,
             ENV_SECRET_LABEL, ENV_CLAIM_LABEL, ENV_PLACEMENT_PROFILES, ENV_REQUIRE_PLACEMENT_PROFILE)


def _flag(text: str) -> bool:
    return text.strip().lower() not in ("0", "false", "no")


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated list, blanks dropped."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


@dataclass(frozen=True)
class OperatorSettings:
    """Everything the operator is configured with; defaults are what a bare `python -m rlscale.operator` gets."""

    # What the run's children get when the spec says nothing (images, checkpoint claims, network policy).
    children: Images = field(default_factory=Images)
    progress_interval: float = 10.0  # seconds between progress reads (and re-plans) per run
    log_level: str = "INFO"
    # kopf logs every handler call at INFO; at 100 runs that drowns what matters.
    kopf_log_level: str = "WARNING"
    bind: str = "0.0.0.0"  # the /metrics endpoint's address
    health: str = ""  # kopf's liveness endpoint, e.g. http://0.0.0.0:8081/healthz ("" = none)
    workers: int = 8  # kopf's thread pool for the (synchronous) handlers
    # Fault injection for the restart test: a pause between child applies widens the window in
    # which the operator can be killed mid-reconcile. Zero in production.
    step_delay: float = 0.0
    kubeconfig: str | None = None  # outside a cluster; None: the client's default (~/.kube/config)
    # What runs may ask for (the chart's `policy` values; operator/policy.py): an empty tuple allows none.
    policy: Policy = field(default_factory=Policy)
    # A run's namespace must carry pod-security.kubernetes.io/enforce (the API server's Pod
    # Security admission then checks the run's pods).
    require_pod_security: bool = True
    lease: str = ""  # "<namespace>/<name>" of the leader-election Lease; "" reconciles without one
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    lease_seconds: float = 15.0  # a standby takes over this long after the leader's last renewal

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorSettings:
        """The settings from `env` (the process's); a placement profile it cannot take raises ValueError."""
        env = os.environ if env is None else env
        d = cls()
        children = Images(
            trainer=env.get(ENV_TRAINER_IMAGE, d.children.trainer),
            rollout=env.get(ENV_ROLLOUT_IMAGE, d.children.rollout),
            checkpoint_storage=env.get(ENV_CHECKPOINT_STORAGE, d.children.checkpoint_storage),
            network_policy=_flag(env.get(ENV_NETWORK_POLICY, "true")),
            metrics_from=_names(env.get(ENV_METRICS_FROM, ",".join(d.children.metrics_from))),
            egress="open" if env.get(ENV_EGRESS, "").strip().lower() == "open" else "restricted",
            egress_cidrs=_names(env.get(ENV_EGRESS_CIDRS, "")))
        return cls(children=children,
                   progress_interval=float(env.get(ENV_PROGRESS_INTERVAL) or d.progress_interval),
                   log_level=env.get(ENV_LOG_LEVEL) or d.log_level,
                   kopf_log_level=env.get(ENV_KOPF_LOG_LEVEL) or d.kopf_log_level,
                   bind=env.get(ENV_BIND) or d.bind, health=env.get(ENV_HEALTH, d.health),
                   workers=int(env.get(ENV_WORKERS) or d.workers),
                   step_delay=float(env.get(ENV_STEP_DELAY) or d.step_delay),
                   kubeconfig=env.get(ENV_KUBECONFIG) or None,
                   policy=Policy(**{k: _names(env.get(name, "")) for k, name in POLICY_ENV.items()},
                                 allow_blocking_evictions=_flag(env.get(ENV_ALLOW_BLOCKING_EVICTIONS, "false")),
                                 secret_label=env.get(ENV_SECRET_LABEL, "").strip(),
                                 claim_label=env.get(ENV_CLAIM_LABEL, "").strip(),
                                 placement_profiles=parse_profiles(env.get(ENV_PLACEMENT_PROFILES, "")),
                                 require_placement_profile=_flag(env.get(ENV_REQUIRE_PLACEMENT_PROFILE, "false"))),
                   require_pod_security=_flag(env.get(ENV_REQUIRE_POD_SECURITY, "true")),
                   lease=env.get(ENV_LEASE, ""), identity=env.get(ENV_IDENTITY) or d.identity,
                   lease_seconds=float(env.get(ENV_LEASE_SECONDS) or d.lease_seconds))
