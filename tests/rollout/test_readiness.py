"""The pods' probe server: /ready follows the process's check, every other path is its metrics."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Gauge

from rlscale.rollout.readiness import READY_PATH, ProbeServer
from tests.conftest import http_get


def get(server: ProbeServer, path: str) -> tuple[int, str]:
    return http_get(server.server_port, path)


@pytest.fixture
def server():
    s = ProbeServer(0, addr="127.0.0.1")
    yield s
    s.shutdown()


def test_ready_answers_503_until_the_check_holds_and_again_when_it_stops_holding(server):
    assert get(server, READY_PATH) == (503, "not ready\n")  # no check named yet: not ready
    state = {"up": False}
    server.ready_when(lambda: state["up"])
    assert get(server, READY_PATH)[0] == 503
    state["up"] = True
    assert get(server, READY_PATH) == (200, "ready\n")
    state["up"] = False  # the state was left (a replica's graceful stop, a released gang)
    assert get(server, READY_PATH)[0] == 503


def test_a_check_that_raises_means_not_ready_and_the_server_keeps_answering(server):
    def broken() -> bool:
        raise RuntimeError("the process group is being torn down")

    server.ready_when(broken)
    assert get(server, READY_PATH)[0] == 503
    server.ready_when(lambda: True)
    assert get(server, READY_PATH)[0] == 200


def test_metrics_are_served_beside_ready_from_the_registry_named_last(server):
    assert get(server, "/metrics") == (200, "")  # up before the process has metrics: empty, not an error
    first, second = CollectorRegistry(), CollectorRegistry()
    Gauge("rlscale_first_thing", "one", registry=first).set(3)
    Gauge("rlscale_second_thing", "two", registry=second).set(4)
    server.serve_registry(first)
    code, text = get(server, "/metrics")
    assert code == 200 and "rlscale_first_thing 3.0" in text
    server.serve_registry(second)
    text = get(server, "/metrics")[1]
    assert "rlscale_second_thing 4.0" in text and "rlscale_first_thing" not in text
    # /ready is not a metric page, and metrics do not make a process ready.
    assert get(server, READY_PATH)[0] == 503


def test_a_registry_given_at_start_is_served_and_a_stopped_server_answers_nothing():
    reg = CollectorRegistry()
    Gauge("rlscale_rollout_weights_version", "v", registry=reg).set(7)
    s = ProbeServer(0, addr="127.0.0.1", registry=reg, check=lambda: True)
    port = s.server_port
    assert "rlscale_rollout_weights_version 7.0" in get(s, "/metrics")[1]
    assert get(s, READY_PATH)[0] == 200
    s.shutdown()
    # What a probe meets once the process is gone: no answer at all, which the kubelet counts as a failure.
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}{READY_PATH}", timeout=5)
