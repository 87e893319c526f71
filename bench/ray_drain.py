"""How long a rollout pod's Ray node takes to stop on SIGTERM, with the run's Ray head up and with it gone
first: the order in which an ended run's pods are scaled down (operator/scaling.py `stopping`).

The worker is started as a rollout pod starts it (rollout.entrypoint.ray_start_command, with the pod's
RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S), beside a head of its own on loopback (token auth off, its own
temp dir); both are this script's children and are stopped by it.

    .venv/bin/python bench/ray_drain.py            # both cases, one line each
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlscale.operator import constants as C
from rlscale.roles import free_port, ray_executable
from rlscale.rollout.entrypoint import ray_start_command


def started(proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    """Wait until `ray start --block` says it blocks (its node is up)."""
    end = time.monotonic() + timeout
    while "block forever" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > end:
            raise SystemExit(f"ray start did not come up (exit {proc.poll()}): {log.read_text()[-2000:]}")
        time.sleep(0.5)


def stop_seconds(head_first: bool) -> float:
    """Seconds from SIGTERM to the worker node's `ray start --block` exiting."""
    tmp = Path(tempfile.mkdtemp(prefix="ray-drain-"))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    port = free_port()
    head_log, worker_log = tmp / "head.log", tmp / "worker.log"
    head = subprocess.Popen([ray_executable(), "start", "--head", f"--port={port}", "--num-cpus=0",
                             "--disable-usage-stats", "--include-dashboard=false", f"--temp-dir={tmp}", "--block"],
                            env={**env, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"},
                            stdout=head_log.open("w"), stderr=subprocess.STDOUT)
    worker = None
    try:
        started(head, head_log)
        worker = subprocess.Popen(ray_start_command(f"127.0.0.1:{port}"),
                                  env={**env, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(C.ROLLOUT_DRAIN_S)},
                                  stdout=worker_log.open("w"), stderr=subprocess.STDOUT)
        started(worker, worker_log)
        time.sleep(2)
        if head_first:
            head.send_signal(signal.SIGTERM)
            head.wait(120)
        t0 = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        worker.wait(C.ROLLOUT_GRACE_S)
        return time.monotonic() - t0
    finally:
        for p in (worker, head):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()


def main() -> int:
    for head_first, what in ((False, "head up"), (True, "head stopped first")):
        print(f"rollout node's stop on SIGTERM, {what}: {stop_seconds(head_first):.1f} s "
              f"(drain timeout {C.ROLLOUT_DRAIN_S} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
