"""Names the operator, its chart and its tests share: labels, annotations, conditions, phases."""

from __future__ import annotations

from rlscale.crd import PLURAL  # noqa: F401  (named once, where the CRD is generated)
from rlscale.metrics_names import DEFAULT_METRICS_PORT
from rlscale.spec import API_GROUP, API_VERSION, KIND, PLUGINS_ENV, PLUGINS_MOUNT  # noqa: F401  (PLUGINS_*: below)

GROUP = API_GROUP
VERSION = API_VERSION
RLRUN_KIND = KIND
FIELD_MANAGER = "rlscale-operator"

# Labels on every child (and on the pods of every workload).
LABEL_RUN = "rlscale.dev/run"
LABEL_ROLE = "rlscale.dev/role"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "rlscale-operator"
# The StatefulSet controller stamps each pod with its ordinal; the learner's RANK.
LABEL_POD_INDEX = "apps.kubernetes.io/pod-index"

ROLE_CONFIG = "config"
ROLE_RAY_HEAD = "ray-head"
ROLE_ROLLOUT = "rollout"
ROLE_LEARNER = "learner"
ROLE_METRICS = "metrics"
ROLE_RUNNER = "runner"  # the ServiceAccount, Role and RoleBinding of the run's pods
ROLE_TOKEN = "ray-token"  # the Secret with the run's Ray auth token
ROLE_NETWORK = "network"  # the run's NetworkPolicy
ROLE_QUEUE = "queue"  # the run's Kueue Workload (spec.scheduling.queueName)
ROLE_GANG = "gang"  # the run's PodGroup (spec.scheduling.podGroup)
ROLE_TOOLS = "tools"  # the tool pods' Deployment, Service and NetworkPolicy (spec.task.toolSandbox.isolation pod)
TOKEN_KEY = "token"
# Kueue admits a workload that carries its LocalQueue's name in this label.
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
# Kueue's Workload API: the operator creates one per queued run and waits for its admission.
KUEUE_API = "kueue.x-k8s.io/v1beta2"
# scheduler-plugins' Coscheduling: the PodGroup API and the label that puts a pod in a group.
POD_GROUP_API = "scheduling.x-k8s.io/v1alpha1"
LABEL_POD_GROUP = "scheduling.x-k8s.io/pod-group"

# The learner (rank 0) reports progress here as JSON; the operator folds it into status.
from rlscale.kube_report import ANNOTATION_PROGRESS  # noqa: E402,F401  (the driver writes it)

# Which plan generation the children were built from (diagnostics, and re-plan accounting).
ANNOTATION_PLAN_HASH = "rlscale.dev/plan-hash"

# Conditions (type names) and phases.
COND_PLANNED = "Planned"
COND_ROLLOUT_READY = "RolloutReady"
COND_LEARNERS_READY = "LearnersReady"
COND_TARGET_REACHED = "TargetReached"
COND_INVALID = "Invalid"
COND_SUSPENDED = "Suspended"
# A run ends in one of these (condition and phase alike); its workloads then go to zero.
COND_SUCCEEDED = "Succeeded"
COND_BUDGET_EXHAUSTED = "BudgetExhausted"
COND_FAILED = "Failed"
# Something is wrong with the run's pods or its driver that may still clear (a crash loop
# under the backoff limit, an image that does not pull, a pod that does not fit).
COND_DEGRADED = "Degraded"
# spec.scheduling.queueName: whether Kueue has admitted the run's Workload (its pods wait for it).
COND_ADMITTED = "Admitted"
CONDITION_TYPES = (COND_PLANNED, COND_ROLLOUT_READY, COND_LEARNERS_READY, COND_TARGET_REACHED,
                   COND_SUCCEEDED, COND_BUDGET_EXHAUSTED, COND_FAILED, COND_DEGRADED, COND_INVALID,
                   COND_SUSPENDED, COND_ADMITTED)

PHASE_PENDING = "Pending"
PHASE_RUNNING = "Running"
PHASE_SUCCEEDED = "Succeeded"
PHASE_FAILED = "Failed"
PHASE_SUSPENDED = "Suspended"
PHASE_QUEUED = "Queued"  # waiting for Kueue to admit the whole run
PHASE_BUDGET_EXHAUSTED = "BudgetExhausted"
# The driver's last report names how the run ended (rlscale.kube_report.OUTCOMES).
OUTCOME_PHASES = {"Succeeded": PHASE_SUCCEEDED, "BudgetExhausted": PHASE_BUDGET_EXHAUSTED, "Failed": PHASE_FAILED}
# Container states that mean a pod of the run cannot do its work (kubelet reasons).
BAD_WAITING = ("CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "InvalidImageName",
               "CreateContainerConfigError", "CreateContainerError", "RunContainerError")

# Pod side: where the resolved run config is mounted and which ports the roles use.
CONFIG_KEY = "run.json"
CONFIG_MOUNT_DIR = "/etc/rlscale"
CONFIG_PATH = f"{CONFIG_MOUNT_DIR}/{CONFIG_KEY}"
# The model volume (spec.model.volume, else an emptyDir): builtin models are installed into it,
# hub ids resolve from the Hugging Face cache inside it.
MODEL_MOUNT = "/models"
# task.pluginVolume is mounted at PLUGINS_MOUNT in the learner pods; PLUGINS_ENV names it there.
HF_HOME = f"{MODEL_MOUNT}/hf"
# Memory-backed /dev/shm: Ray's object store (weight publishes) and torch's shared memory.
SHM_MOUNT = "/dev/shm"
# The images' user (images/torch) and its HOME, an emptyDir: the root filesystem is read-only.
RUN_AS_USER = 1000
HOME_MOUNT = "/home/rlscale"
REPORT_DIR = "report"  # under spec.checkpoint.path, on the checkpoint volume
METRICS_PORT = DEFAULT_METRICS_PORT
RAY_GCS_PORT = 6379
RAY_CLIENT_PORT = 10001
MASTER_PORT = 29500
# The rollout and learner pods answer their readiness probe at this path on the metrics port
# (rlscale.rollout.readiness serves it; the same string is named there).
READY_PATH = "/ready"
# Seconds a rollout replica Serve removes gets to finish its in-flight requests: Serve's
# graceful_shutdown_timeout_s, rlscale.rollout.serve.GRACEFUL_SHUTDOWN_S (not imported here: that module
# imports Ray; tests/rollout/test_scaling.py checks the two agree).
ROLLOUT_GRACEFUL_SHUTDOWN_S = 120
# A rollout pod's `ray start --block` marks its Ray node draining on SIGTERM and waits up to
# RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S (Ray's default 30 s) for the node to empty: Serve starts a
# replacement elsewhere and stops the pod's replica gracefully once the deadline is no further than
# the replica's graceful shutdown. Set to that plus 30 s to place a replacement first.
ROLLOUT_DRAIN_S = ROLLOUT_GRACEFUL_SHUTDOWN_S + 30
# The pod's terminationGracePeriodSeconds: the drain, then 30 s for Ray to stop its processes.
ROLLOUT_GRACE_S = ROLLOUT_DRAIN_S + 30
GPU_RESOURCE = "nvidia.com/gpu"

# Images when the spec names none (the chart sets others: operator/settings.py).
DEFAULT_TRAINER_IMAGE = "ghcr.io/rlscale/trainer:0.1.0"
DEFAULT_ROLLOUT_IMAGE = "ghcr.io/rlscale/rollout:0.1.0"
