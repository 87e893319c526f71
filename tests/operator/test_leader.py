"""Leader election over a Lease (rlscale.operator.leader), against the in-memory API server with
clocks the test moves; the chart's two replicas on the real control plane are in test_ha.py."""

from __future__ import annotations

import threading
import time
import urllib.request

import pytest
from fakekube import FakeKube, _error

from rlscale.operator.leader import LEASE_API, LeaderElector, StandbyHealth, parse_lease_ref
from rlscale.operator.settings import OperatorSettings


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def pair(kube=None, clock=None):
    kube, clock = kube or FakeKube(), clock or Clock()

    def mk(who):
        return LeaderElector(kube, "sys", "lead", who, lease_s=15, renew_deadline_s=10, retry_s=2,
                             clock=clock, wall=lambda: 1.8e9 + clock.t)
    return kube, clock, mk("a"), mk("b")


def lease(kube):
    return kube.get(LEASE_API, "Lease", "sys", "lead")["spec"]


def test_first_candidate_creates_the_lease_and_the_second_waits():
    kube, clock, a, b = pair()
    assert a.try_acquire_or_renew()
    assert lease(kube)["holderIdentity"] == "a" and lease(kube)["leaseTransitions"] == 0
    assert not b.try_acquire_or_renew()
    for _ in range(20):  # a renews every 2 s for 40 s: b never takes it
        clock.t += 2
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    assert lease(kube)["holderIdentity"] == "a"


def test_standby_takes_over_a_lease_after_the_holder_stops_renewing():
    kube, clock, a, b = pair()
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b first sees the record now
    clock.t += 14
    assert not b.try_acquire_or_renew()  # 14 s without a change: still a's
    clock.t += 1.5
    assert b.try_acquire_or_renew()
    spec = lease(kube)
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    # The old holder, back, finds the lease taken and waits in turn.
    assert not a.try_acquire_or_renew()


def test_expiry_is_judged_by_the_candidates_own_clock_not_the_holders_timestamps():
    # The holder's renewTime is far in the past by the wall clock (a skewed node), yet it keeps
    # changing: the standby must not take the lease.
    kube, clock, a, b = pair()
    a.wall = lambda: 1.0e9 + clock.t
    assert a.try_acquire_or_renew()
    for _ in range(12):
        clock.t += 2
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()


def test_a_released_lease_is_taken_at_the_next_round():
    kube, clock, a, b = pair()
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.release()
    assert lease(kube).get("holderIdentity") is None
    assert b.try_acquire_or_renew()
    assert lease(kube)["holderIdentity"] == "b"


def test_two_candidates_racing_for_an_expired_lease_one_wins():
    kube, clock, a, b = pair()
    c = LeaderElector(kube, "sys", "lead", "c", clock=clock, wall=lambda: 1.8e9 + clock.t)
    assert c.try_acquire_or_renew()
    assert not a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    clock.t += 16
    # a and b both read the expired record; a writes first, b's write is against a stale resourceVersion.
    stale = kube.get(LEASE_API, "Lease", "sys", "lead")
    assert a.try_acquire_or_renew()
    real_get = kube.get
    kube.get = lambda *args: stale
    try:
        assert not b.try_acquire_or_renew()
    finally:
        kube.get = real_get
    assert lease(kube)["holderIdentity"] == "a"


def test_renewal_fails_after_the_deadline_and_the_holder_steps_down():
    kube, clock, a, _ = pair()
    assert a.try_acquire_or_renew()
    real = kube.merge_patch

    def refuse(*args, **kw):
        raise _error(500, "InternalError")
    kube.merge_patch = refuse
    clock.t += 4
    assert a.renew_once()  # failing, but within the 10 s deadline
    clock.t += 7
    assert not a.renew_once()  # 11 s since the last renewal: step down before anyone may take over
    kube.merge_patch = real


def test_hold_calls_on_lost_once_the_lease_is_taken_away():
    kube = FakeKube()
    a = LeaderElector(kube, "sys", "lead", "a", lease_s=1.5, renew_deadline_s=0.6, retry_s=0.1)
    assert a.try_acquire_or_renew()
    lost, stop = threading.Event(), threading.Event()
    a.hold(lost.set, stop)
    time.sleep(0.3)
    assert not lost.is_set()
    kube.patch(LEASE_API, "Lease", "sys", "lead", {"spec": {"holderIdentity": "usurper"}})
    assert lost.wait(5)
    stop.set()


def test_settings_and_bad_lease_reference():
    s = OperatorSettings.from_env({"RLSCALE_OPERATOR_LEASE": "rlscale-system/rlscale-leader",
                                   "RLSCALE_OPERATOR_IDENTITY": "pod-0", "RLSCALE_OPERATOR_LEASE_SECONDS": "6"})
    assert (s.lease, s.identity, s.lease_seconds) == ("rlscale-system/rlscale-leader", "pod-0", 6.0)
    assert parse_lease_ref(s.lease) == ("rlscale-system", "rlscale-leader")
    assert OperatorSettings.from_env({}).lease == ""
    with pytest.raises(ValueError, match="RLSCALE_OPERATOR_LEASE='nolease'.*<namespace>/<name>"):
        parse_lease_ref("nolease")
    with pytest.raises(ValueError, match="retry"):
        LeaderElector(FakeKube(), "a", "b", "c", lease_s=5, renew_deadline_s=6, retry_s=1)


def test_standby_health_answers_the_liveness_probe():
    h = StandbyHealth("http://127.0.0.1:0/healthz")
    try:
        port = h.server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            assert r.status == 200 and b"standby" in r.read()
    finally:
        h.close()


class Hanging(FakeKube):
    """An API server whose Lease calls hang once `hang` is set (a half-open connection): they return only
    when `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.hang, self.release = threading.Event(), threading.Event()
        self.lease_writes_after_hang = 0

    def get(self, *args, **kw):
        if self.hang.is_set():
            self.release.wait(30)
        return super().get(*args, **kw)

    def merge_patch(self, *args, **kw):
        if self.hang.is_set():
            self.lease_writes_after_hang += 1
        return super().merge_patch(*args, **kw)


def test_a_renewal_hung_in_the_api_still_steps_down_at_the_deadline_and_writes_nothing_after():
    """The client's own timeout (30 s) is longer than the lease: the watchdog, not the hung call, keeps
    the renew deadline, and a renewal that returns after it writes no Lease."""
    kube = Hanging()
    a = LeaderElector(kube, "sys", "lead", "a", lease_s=1.5, renew_deadline_s=0.6, retry_s=0.1)
    assert a.try_acquire_or_renew()
    lost, stop = threading.Event(), threading.Event()
    a.hold(lost.set, stop)
    time.sleep(0.3)
    assert not lost.is_set()
    t0 = time.monotonic()
    kube.hang.set()
    assert lost.wait(5)
    waited = time.monotonic() - t0
    # The deadline counts from the last renewal, at most one retry (0.1 s) before the hang; the watchdog
    # looks every 0.025 s.
    assert waited <= 0.6 + 0.1 + 0.2, waited
    assert a.fenced.is_set()
    kube.release.set()  # the hung call returns: the fenced elector must not renew
    time.sleep(0.4)
    assert kube.lease_writes_after_hang == 0 and not a.try_acquire_or_renew()
    stop.set()


def test_an_outage_longer_than_the_lease_ends_the_lead_before_a_standby_may_take_it():
    kube = FakeKube()
    a = LeaderElector(kube, "sys", "lead", "a", lease_s=1.5, renew_deadline_s=0.6, retry_s=0.1)
    assert a.try_acquire_or_renew()
    lost, stop = threading.Event(), threading.Event()
    a.hold(lost.set, stop)
    real_get = kube.get

    def away(*args, **kw):
        raise _error(503, "ServiceUnavailable")
    kube.get = away
    t0 = time.monotonic()
    assert lost.wait(5)
    stepped_down = time.monotonic() - t0
    kube.get = real_get
    # A standby takes over no sooner than lease_s after the last record it saw change.
    assert stepped_down < 1.5, stepped_down
    stop.set()
