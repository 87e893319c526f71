"""A learner process told to stop stops: before its role's handlers (as its container's PID 1 it would
ignore a signal it has no handler for), and after rank 0 handled the stop while it finished its run (the
kubelet sends one SIGTERM: waiting for a second held the pod its whole grace period). trainer/stops.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

STARTING = """
import time
from rlscale.trainer.stops import exit_on_stop
exit_on_stop()
print("ready", flush=True)
time.sleep(120)
"""

FINISHING = """
import os, signal
from rlscale.trainer import run_env, stops

class Driver:
    stop_requested = False

    def request_stop(self, *_):
        self.stop_requested = True

driver = Driver()
run_env.install_stop_handlers(driver)
os.kill(os.getpid(), signal.SIGTERM)  # while rank 0 finishes: the driver takes it
assert driver.stop_requested and stops.STOPS == [signal.SIGTERM], stops.STOPS
run_env.wait_for_termination()  # the stop came already: no second one to wait for
print("returned", flush=True)
"""


def test_a_stop_before_the_roles_handlers_ends_the_process_at_once():
    proc = subprocess.Popen([sys.executable, "-c", STARTING], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # Exit 0 by the handler (it is how a stopped pod's process ends), not death by the signal (-15).
        assert proc.wait(timeout=20) == 0 and time.monotonic() - t0 < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_stop_rank_0_took_while_finishing_is_not_waited_for_again():
    out = subprocess.run([sys.executable, "-c", FINISHING], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "returned", out.stderr[-3000:]
