"""A rollout pod stopped before its Ray node has started exits at once. In the pod its process is PID 1,
which the kernel spares every signal it has no handler for: without one from the start, a SIGTERM while
it waited for the head was lost and the pod sat out its grace period (rollout/entrypoint.py main)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rlscale.roles import free_port
from rlscale.runconfig import RunConfig
from rlscale.spec import parse_spec
from tests.conftest import wait_for


def catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler for `sig` (SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def test_a_pod_stopped_while_it_waits_for_the_head_exits_at_once(tmp_path):
    # A head that never listens: the entrypoint waits for it (HEAD_WAIT_S), as a rollout pod does while
    # the run's head pod starts.
    cfg = RunConfig(run="r", namespace="ns", spec=parse_spec({"hardware": {"accelerator": "cpu"}}),
                    ray_address=f"127.0.0.1:{free_port()}")
    path = cfg.save(tmp_path / "run.json")
    proc = subprocess.Popen([sys.executable, "-m", "rlscale.rollout.entrypoint", "--config", str(path)],
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for("the entrypoint to handle SIGTERM", lambda: catches(proc.pid, signal.SIGTERM), 60, 0.1)
        time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read()  # still waiting for the head
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=20)
        # Exit 0 by its handler (a stop is how the role ends), not death by the signal (-15).
        assert rc == 0 and time.monotonic() - t0 < 10, (rc, proc.stderr.read())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
