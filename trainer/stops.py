"""The stops (SIGTERM, SIGINT) a learner process has received, whoever handled them.

The kubelet sends one SIGTERM, and the launcher passes it on once: a rank that handled it while busy (rank 0
finishing its run, or reporting its failure) must not wait for a second (run_env.wait_for_termination). And
before any handler of its own, the process is PID 1 of its container (one rank a pod), which the kernel
spares every signal it has no handler for: a stop during start-up was lost and the pod sat out its grace
period (90 s and more). On the real node both held a learner pod 88-90 s past its run's end
(tests/node/test_quickstart_k8s.py: the quickstart's learner-0 after Succeeded, bad-reward's after
DriverFailed, in the run's pod timeline)."""

from __future__ import annotations

import signal

STOPS: list[int] = []  # the signals received, oldest first
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_on_stop() -> None:
    """Until a role's own handlers take over: a stop is noted and ends the process at once (there is
    nothing to checkpoint before the driver's loop)."""
    def on_stop(signum, _frame):
        STOPS.append(signum)
        raise SystemExit(0)
    for sig in SIGNALS:
        signal.signal(sig, on_stop)


def noted(handler):
    """`handler` (a signal handler), after noting the stop."""
    def on_stop(signum, frame):
        STOPS.append(signum)
        return handler(signum, frame)
    return on_stop
