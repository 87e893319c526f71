"""A rollout pod waits for its run's Ray head instead of failing (and restarting) before it listens, and
leaves for a restart when the head is replaced (rollout/entrypoint.py watch_head)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from rlscale.roles import free_port
from rlscale.rollout.entrypoint import wait_for_head
from tests.conftest import wait_for


def test_the_wait_ends_when_the_head_starts_listening():
    port = free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen_later():
        time.sleep(1.0)
        server.bind(("127.0.0.1", port))
        server.listen()

    t = threading.Thread(target=listen_later)
    t.start()
    try:
        t0 = time.monotonic()
        assert wait_for_head(f"127.0.0.1:{port}", timeout=30, poll=0.1)
        assert time.monotonic() - t0 >= 0.9  # it did wait for the listener
    finally:
        t.join()
        server.close()


def test_a_head_that_never_listens_ends_the_wait_at_the_timeout():
    t0 = time.monotonic()
    assert not wait_for_head(f"127.0.0.1:{free_port()}", timeout=0.5, poll=0.1)
    assert time.monotonic() - t0 < 5


class _Node:
    """A stand-in for the `ray start --block` process: poll() is None while it runs."""

    def __init__(self):
        self.rc = None

    def poll(self):
        return self.rc


class _Head:
    def __init__(self):
        self.up, self.cluster = False, "aa" * 14

    def probe(self) -> str:
        if not self.up:
            raise ConnectionError("GCS not answering")
        return self.cluster


def _watch(head: _Head, node: _Node, stopping: list):
    from rlscale.rollout.entrypoint import watch_head
    from rlscale.trainer.gang import HeadWatch

    exits: list[int] = []
    w = watch_head("head:6379", node, stopping, exit_fn=exits.append, retry_s=0.02, leave_after_s=0.2,
                   make_watch=lambda _address, exit_fn: HeadWatch(head.probe, interval=0.02, exit_fn=exit_fn))
    return w, exits


def test_a_replaced_head_ends_the_rollout_pod_within_the_watch_interval():
    """Not at Ray's 60 s GCS timeout: the container restarts and joins the new head."""
    from rlscale.trainer.gang import EXIT_GANG

    head, node = _Head(), _Node()
    w, exits = _watch(head, node, [])
    time.sleep(0.1)  # the node still joining: the GCS does not answer, the watch waits for it
    assert w.cluster == "" and not exits
    head.up = True
    wait_for("the watch to learn the head's cluster", lambda: w.cluster == head.cluster, 5, 0.01)
    time.sleep(0.1)
    assert not exits  # the same head: nothing happens
    head.cluster = "bb" * 14  # a new head pod behind the same Service
    t0 = time.monotonic()
    wait_for("the rollout pod to leave", lambda: exits == [EXIT_GANG], 5, 0.01)
    assert time.monotonic() - t0 >= 0.2  # after rank 0's watch has had its turn
    w.stop()


@pytest.mark.parametrize("ended", ["stopping", "node exited"])
def test_a_stop_or_an_ended_node_keeps_the_head_watch_quiet(ended):
    head, node, stopping = _Head(), _Node(), []
    head.up = True
    w, exits = _watch(head, node, stopping)
    wait_for("the watch to learn the head's cluster", lambda: w.cluster == head.cluster, 5, 0.01)
    head.cluster = "bb" * 14
    time.sleep(0.1)  # seen, and waiting for rank 0 to go first: then the pod is stopped, or its node ends
    if ended == "stopping":
        stopping.append(15)  # SIGTERM: the run scales the pods down, the head goes last
    else:
        node.rc = 1
    time.sleep(0.4)
    assert not exits
    w.stop()
