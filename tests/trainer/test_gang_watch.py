"""Rank 0's watch of its followers (trainer/gang.py) on a real TCP store: a follower that died and came
back before the patience ran out bumps the same heartbeat counter, and only its new process id tells
rank 0 that the gang is broken (the real-node faults run once waited 15 minutes on it)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from rlscale.roles import free_port
from rlscale.trainer.gang import EXIT_GANG, GangWatch


@pytest.fixture
def store_port():
    import torch.distributed as dist

    port = free_port()
    master = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    yield port
    del master


def _until(pred, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end and not pred():
        time.sleep(0.02)
    return pred()


def _gang(port: int, exits: list[int]) -> tuple[GangWatch, GangWatch]:
    rank0 = GangWatch(0, 2, "127.0.0.1", port, interval=0.05, patience=30, exit_fn=exits.append)
    rank0.start()
    follower = GangWatch(1, 2, "127.0.0.1", port, interval=0.05, patience=30, exit_fn=exits.append)
    follower.start()
    return rank0, follower


def test_a_follower_restarted_within_the_patience_ends_rank_0(store_port):
    exits: list[int] = []
    rank0, follower = _gang(store_port, exits)
    assert not _until(lambda: exits, 0.5)  # the same process, beating: nothing happens
    follower.stop()  # the follower's process dies...
    again = GangWatch(1, 2, "127.0.0.1", store_port, interval=0.05, patience=30, exit_fn=exits.append)
    again.start()  # ...and its container's next process beats on the same counter, well within 30 s
    try:
        assert _until(lambda: exits == [EXIT_GANG], 5)
    finally:
        for w in (rank0, again):
            w.stop()


def test_a_steady_gang_keeps_running(store_port):
    exits: list[int] = []
    rank0, follower = _gang(store_port, exits)
    try:
        assert not _until(lambda: exits, 1.0)
    finally:
        for w in (rank0, follower):
            w.stop()


def test_a_restarted_follower_waits_out_the_previous_rank_0_before_it_joins():
    """The faults run's hang (stop 49): a follower's new process found the previous rank 0's store still up.
    It now tells that rank 0, whose watch exits, and joins only once the store is gone."""
    import threading

    import torch.distributed as dist

    from rlscale.trainer.gang import leave_the_previous_gang

    port = free_port()
    master = [dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10),
                            wait_for_workers=False)]
    exits: list[int] = []

    def rank0_exits(code: int) -> None:  # the process ends: its store with it
        exits.append(code)
        master.clear()

    rank0 = GangWatch(0, 2, "127.0.0.1", port, interval=0.05, patience=30, exit_fn=rank0_exits)
    rank0.start()
    old = GangWatch(1, 2, "127.0.0.1", port, interval=0.05, patience=30, exit_fn=lambda code: None)
    old.start()
    old.stop()  # the follower's process died; rank 0 has not noticed (no collective yet)
    assert not _until(lambda: exits, 0.3)
    joined = threading.Event()
    t = threading.Thread(target=lambda: (leave_the_previous_gang(1, 2, "127.0.0.1", port, poll=0.05,
                                                                 connect_timeout=0.5), joined.set()))
    try:
        t.start()
        assert _until(lambda: exits == [EXIT_GANG], 5)  # told, the previous rank 0 left
        assert joined.wait(10)  # and the follower went on to the rendezvous
    finally:
        rank0.stop()
        t.join(10)


def test_a_new_rank_0s_store_is_joined_at_once_and_left_as_it_was(store_port):
    import torch.distributed as dist

    from rlscale.trainer.gang import leave_the_previous_gang

    t0 = time.monotonic()
    leave_the_previous_gang(1, 2, "127.0.0.1", store_port, connect_timeout=1)
    assert time.monotonic() - t0 < 1.0
    probe = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=2),
                          wait_for_workers=False)
    assert not probe.check(["rlscale/gang/proc/1"])  # nothing announced to a gang that is not up
    leave_the_previous_gang(1, 2, "127.0.0.1", free_port(), connect_timeout=0.5)  # no store yet: goes on


def _frozen_store_server(port: int):
    """A process serving a TCP store that already holds a rank 0's boot id; SIGSTOP freezes it."""
    import subprocess
    import sys

    server = subprocess.Popen([sys.executable, "-c",
                               "import sys, time, torch.distributed as d\n"
                               f"s = d.TCPStore('127.0.0.1', {port}, is_master=True, wait_for_workers=False)\n"
                               "s.set('rlscale/gang/boot', 'b0'); print('up', flush=True); time.sleep(120)"],
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "up"
    return server


# A follower whose watch thread is inside a store call when it stops and exits: rank 0's store is frozen
# (SIGSTOP; a call to it then blocks whatever the client's timeout, measured), and it dies (the call returns)
# a second after stop() began; an object whose __del__ sleeps keeps the interpreter finalizing meanwhile.
_EXIT_IN_A_CALL = """
import sys, time
from rlscale.trainer.gang import GangWatch
w = GangWatch(1, 2, "127.0.0.1", int(sys.argv[1]), interval=0.05, patience=60)
w.start()
print("started", flush=True)
sys.stdin.readline()  # the store is frozen now
time.sleep(0.5)  # the watch's next call is in flight
print("stopping", flush=True)
w.stop()
print("stopped", w._thread.is_alive(), flush=True)
class Finalizing:
    def __del__(self, sleep=time.sleep):  # module globals are gone by then
        sleep(6)
keep = Finalizing()  # collected after the interpreter began to finalize
"""


@pytest.mark.slow
def test_a_rank_that_stops_its_watch_in_a_store_call_exits_cleanly():
    """Without stop() waiting for the thread, the call returns while the interpreter finalizes and the
    process aborts ("terminate called without an active exception", -6), the end two CI runs' 2-rank learner
    tests met."""
    import os
    import signal
    import subprocess
    import sys

    port = free_port()
    server = _frozen_store_server(port)
    try:
        rank = subprocess.Popen([sys.executable, "-c", _EXIT_IN_A_CALL, str(port)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert rank.stdout.readline().strip() == "started"
        os.kill(server.pid, signal.SIGSTOP)
        rank.stdin.write("go\n")
        rank.stdin.flush()
        assert rank.stdout.readline().strip() == "stopping"
        time.sleep(1)
        server.kill()  # rank 0's process ends: the call in flight fails now
        out = rank.communicate(timeout=60)[0]
        assert rank.returncode == 0, out[-2000:]
        assert "stopped False" in out  # stop() returned with the thread gone
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()
        server.wait()


def test_a_follower_leaves_a_frozen_rank_0_after_the_patience():
    """Rank 0's process frozen (its node cut off reads the same: no reset comes): the follower's store call
    never returns, and the follower still leaves once rank 0 has not answered for the patience."""
    import os
    import signal
    import threading

    port = free_port()
    server = _frozen_store_server(port)
    exits: list[int] = []
    w = GangWatch(1, 2, "127.0.0.1", port, interval=0.05, patience=1.0, exit_fn=exits.append)
    try:
        w.start()
        assert not _until(lambda: exits, 0.5)  # rank 0 answers: nothing happens
        os.kill(server.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        assert _until(lambda: exits == [EXIT_GANG], 6), exits
        assert time.monotonic() - t0 >= 0.9  # not before the patience (a call begun up to an interval earlier)
    finally:
        w.stop()
        os.kill(server.pid, signal.SIGCONT)
        server.kill()  # the stuck call fails now, and its thread ends
        server.wait()
    assert _until(lambda: not any(t.name == "gang-watch-call" for t in threading.enumerate()), 10)
