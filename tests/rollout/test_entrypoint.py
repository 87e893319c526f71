"""A rollout pod waits for its run's Ray head instead of failing (and restarting) before it listens."""

from __future__ import annotations

import socket
import threading
import time

from rlscale.roles import free_port
from rlscale.rollout.entrypoint import wait_for_head


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
