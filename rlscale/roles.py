"""Role helpers shared by the runner and the pods: the Ray head entrypoint and address handling."""

from __future__ import annotations

import os
import random
import shutil
import socket
import sys
from enum import IntEnum, StrEnum
from pathlib import Path

from rlscale.runconfig import load_run_config

DEFAULT_RAY_PORT = 6379


class Role(StrEnum):
    """The processes of a run: one entrypoint each (`rlscale ray-head|rollout|learner`), a pod each on Kubernetes."""

    RAY_HEAD = "ray-head"
    ROLLOUT = "rollout"
    LEARNER = "learner"


class Outcome(StrEnum):
    """How a run ended, in the driver's last report; the operator makes each a condition and a phase."""

    SUCCEEDED = "Succeeded"
    BUDGET_EXHAUSTED = "BudgetExhausted"
    # An error a restart cannot fix (a reward that does not import, a spec the code cannot carry
    # out): the run stops at once instead of crash-looping to its backoff limit.
    FAILED = "Failed"


class RunEnd(IntEnum):
    """The driver's (learner rank 0's) exit code; the local runner passes it on."""

    TARGET = 0
    BUDGET = 3
    INTERRUPTED = 130

    @property
    def outcome(self) -> Outcome | None:
        """The outcome it reports; an interrupted run has none (it resumes)."""
        return {RunEnd.TARGET: Outcome.SUCCEEDED, RunEnd.BUDGET: Outcome.BUDGET_EXHAUSTED}.get(self)

# The Ray resource a rollout node offers, one per rollout pod / `rlscale rollout` process; Serve
# places one replica per slot. Here, not in rollout/serve.py: the rollout role starts its node
# without importing Ray Serve (docs/measurements.md, "A local run's start and end").
ROLLOUT_RESOURCE = Role.ROLLOUT.value


def split_address(address: str | None, default_port: int = DEFAULT_RAY_PORT) -> tuple[str, int]:
    """'host:port' -> (host, port); a bare host gets the default port."""
    if not address:
        return "0.0.0.0", default_port
    host, _, port = address.rpartition(":")
    if not host:
        return port, default_port
    return host, int(port)


def ray_executable() -> str:
    """The `ray` CLI next to this interpreter (a venv need not be on PATH), else the one on PATH."""
    found = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    if found is None:
        raise FileNotFoundError("the `ray` command is not installed next to this Python nor on PATH; "
                                "install ray[serve]")
    return found


# Ports nothing hands out by itself: the kernel's ephemeral range starts at 32768 and Ray
# gives its workers 10002-19999. A port picked by binding to 0 is an ephemeral one, which
# a process starting between our pick and our bind (Ray starts dozens) may be given.
PICK_PORTS = (20000, 32000)
_port_rng = random.SystemRandom()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, from PICK_PORTS (the kernel's choice if that range is full)."""
    for _ in range(100):
        port = _port_rng.randrange(*PICK_PORTS)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ray_auth_env(environ=None) -> dict[str, str]:
    """Ray 2.60's head turns token auth on when a token exists; clients given an explicit address must too."""
    env = dict(os.environ if environ is None else environ)
    if "RAY_AUTH_MODE" not in env:
        token_file = Path(env.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
        if env.get("RAY_AUTH_TOKEN") or token_file.is_file():
            env["RAY_AUTH_MODE"] = "token"
    return env


def ray_node_env(environ=None) -> dict[str, str]:
    """The environment for `ray start` of a run's node: auth as in ray_auth_env, and workers at normal priority.

    Ray starts its workers at niceness 15 by default; here those workers are the rollout
    replicas, which the learner waits on every step, so on a shared machine a niced
    replica would make the whole loop yield to any neighbour. RAY_worker_niceness set in
    the environment still wins.
    """
    env = ray_auth_env(environ)
    env.setdefault("RAY_worker_niceness", "0")
    return env


# Every node of a run starts without Ray's log monitor: it tails the workers' logs for drivers, and
# the driver joins with log_to_driver=False, so it only costs CPU (docs/measurements.md, "A quiet Ray").
NO_LOG_MONITOR = "--include-log-monitor=false"


def ray_head_command(ray_address: str | None, num_cpus: int | None = None,
                     object_store_bytes: int | None = None) -> list[str]:
    """`ray start --head` for the run: no dashboard, no usage stats, blocking so the process is the role."""
    host, port = split_address(ray_address)
    cmd = [ray_executable(), "start", "--head", f"--port={port}", "--block", "--disable-usage-stats",
           "--include-dashboard=false", NO_LOG_MONITOR]
    if host in ("127.0.0.1", "localhost"):
        cmd.append("--node-ip-address=127.0.0.1")
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    if object_store_bytes:
        cmd.append(f"--object-store-memory={object_store_bytes}")
    return cmd


def ray_head_env(environ=None) -> dict[str, str]:
    """The head pod's `ray start --head` environment: ray_node_env, and no drain on SIGTERM (unless the
    environment sets one). Draining waits for the node's actors to move elsewhere, and the head's (Serve's
    controller) have nowhere to go: the head stops once the run has ended (its last pods gone) or is
    deleted, and its GCS is the cluster. Ray's default 30 s drain held the quickstart's ended run for
    30 s (its head pod Terminating 30 s in tests/node/test_quickstart_k8s.py's pod timeline)."""
    env = ray_node_env(environ)
    env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
    return env


def ray_head_main(config_path: str | os.PathLike | None) -> int:
    """Become the run's Ray head: exec `ray start --head --block` so signals reach Ray directly."""
    cfg = load_run_config(config_path)
    cmd = ray_head_command(cfg.ray_address, cfg.local.head_cpus if cfg.local else None, cfg.object_store_bytes)
    os.execvpe(cmd[0], cmd, ray_head_env())
    return 0  # not reached
