"""Scaling the rollout app as the driver does it on Kubernetes: a scale-up past the `rollout` slots
there are serves with those it has (and never raises), a scale-down returns once the removed
replicas are gone, and the app names the pods that still host a replica (what the operator's
ordered scale-down reads)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from rlscale.rollout.placement import ServingState, hosting_pods, live

from .conftest import KV_CACHE_BYTES

PODS = ("t-rollout-a", "t-rollout-b")
DRAIN_S = 60  # the pods' drain on SIGTERM here (the operator sets constants.ROLLOUT_DRAIN_S)
GRACE_S = 20  # the replicas' graceful shutdown here
PROMPT = [1] + [4 + (i * 5) % 13 for i in range(20)]


def test_the_operator_sizes_the_rollout_pods_from_the_replicas_graceful_shutdown():
    from rlscale.operator import constants as C
    from rlscale.rollout.serve import GRACEFUL_SHUTDOWN_S, RolloutOptions

    assert RolloutOptions().graceful_shutdown_timeout_s == GRACEFUL_SHUTDOWN_S == C.ROLLOUT_GRACEFUL_SHUTDOWN_S
    assert C.ROLLOUT_GRACE_S > C.ROLLOUT_DRAIN_S > GRACEFUL_SHUTDOWN_S


def test_the_serving_state_and_the_pods_of_live_replicas():
    s = ServingState(3, {"RUNNING": 2, "STARTING": 1}, ("p-a", "p-b"))
    assert (s.running, s.drained, s.settled) == (2, True, False)
    assert not ServingState(1, {"RUNNING": 1, "STOPPING": 1}).drained  # a removed replica still draining
    assert ServingState(1, {"RUNNING": 1}).settled
    registered = {"r1": {"pod": "p-a", "actor": "SERVE_REPLICA::app#R#r1"},
                  "r2": {"pod": "p-b", "actor": "SERVE_REPLICA::app#R#r2"},  # crashed: Ray dropped its name
                  "r3": {"pod": None, "actor": None}}  # outside Kubernetes and Serve
    alive = live(registered, {"SERVE_REPLICA::app#R#r1"})
    assert set(alive) == {"r1", "r3"} and hosting_pods(alive) == ("p-a",)
    assert set(live(registered, None)) == {"r1", "r2", "r3"}  # Ray could not say: keep every one


@pytest.fixture(scope="module")
def two_pods(tmp_path_factory):
    """A local Ray head offering no `rollout` slot, and two `rlscale rollout` processes that each
    offer one and name their pod (POD_NAME, as the operator sets it), as two rollout pods do."""
    import sys

    import ray

    from rlscale.runconfig import RunConfig

    assert not ray.is_initialized(), "another test left Ray running; it must shut it down"
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    address = ray.get_runtime_context().gcs_address
    config = RunConfig(run="t", spec={"hardware": {"accelerator": "cpu"}}, ray_address=address).save(
        tmp_path_factory.mktemp("scaling") / "run.json")
    procs = []
    try:
        for i, pod in enumerate(PODS, 1):
            # As a pod starts it: nothing inherited from this test's ray.init (RAY_AUTH_MODE). One
            # after the other: two `ray start` at once on one host picked the same port (raylet
            # "bind: Address already in use").
            env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"} | {
                "POD_NAME": pod, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(DRAIN_S)}
            procs.append(subprocess.Popen([sys.executable, "-m", "rlscale.rollout.entrypoint", "--config", str(config)],
                                          env=env, start_new_session=True))
            deadline = time.monotonic() + 180
            while ray.cluster_resources().get("rollout", 0) < i:
                assert time.monotonic() < deadline, f"the rollout node of {pod} never joined"
                assert procs[-1].poll() is None, f"the rollout node of {pod} exited"
                time.sleep(0.5)
        yield dict(zip(PODS, procs, strict=True))
    finally:
        from ray import serve

        serve.shutdown()
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        ray.shutdown()


def _wait(what, fn, timeout=300.0):
    deadline = time.monotonic() + timeout
    while not (got := fn()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
    return got


@pytest.fixture(scope="module")
def client(two_pods, model_dirs):
    """One rollout app for the module: three replicas planned on the two pods' two slots. The drain
    test below starts from the first test's app scaled to one replica: with an app of its own (one
    vLLM load more) its call took 39.9 s, from this one 23.5 s, and the module 132.9 s, then 99.8 s
    (2 cores; `pytest tests/rollout/test_scaling.py --durations=0`)."""
    from rlscale.rollout.engine import EngineConfig
    from rlscale.rollout.serve import RolloutClient, RolloutOptions

    t0 = time.monotonic()
    # Three planned, two slots: the deploy returns with the two that run (a driver resumed on too few
    # pods trains), not after Serve's wait for the third, which never comes.
    c = RolloutClient.deploy(
        EngineConfig(model=model_dirs[0], kv_cache_bytes=KV_CACHE_BYTES, max_num_seqs=16),
        RolloutOptions(app_name="t-scaling", num_replicas=3, version_wait_s=3.0, graceful_shutdown_timeout_s=GRACE_S))
    print(f"deployed in {time.monotonic() - t0:.0f} s: {c.serving()}")
    try:
        yield c
    finally:
        c.shutdown()


@pytest.mark.slow
def test_a_scale_past_the_rollout_slots_serves_with_those_there_and_never_raises(client):
    s = _wait("both slots serving", lambda: (x := client.serving()).running == 2 and x)
    assert (s.target, s.pods) == (3, PODS) and s.states.get("STARTING") == 1, s
    out = client.generate([PROMPT] * 4, samples_per_prompt=2, max_new_tokens=8, seed=1)
    assert len(out) == 4 and all(len(g) == 2 and g[0].token_ids for g in out)
    # Down to one: returns once the removed replica is gone; one pod is free, and named so.
    s = client.scale(1)
    assert s.drained and s.states == {"RUNNING": 1} and len(s.pods) == 1, s
    assert s.pods[0] in PODS and client.serving().pods == s.pods
    # Up to three again: returns at once; Serve places what fits, the call waits for none of it.
    t1 = time.monotonic()
    s = client.scale(3)
    assert time.monotonic() - t1 < 30 and s.target == 3, s
    s = _wait("a second replica", lambda: (x := client.serving()).running == 2 and x)
    assert s.pods == PODS and s.states.get("STARTING") == 1, s
    out = client.generate([PROMPT] * 4, samples_per_prompt=2, max_new_tokens=8, seed=2)
    assert len(out) == 4
    print("registered:", json.dumps(client.replicas(), default=str)[:400])


@pytest.mark.slow
def test_a_stopped_pod_drains_its_replica_and_loses_no_request(two_pods, client):
    """What the kubelet's SIGTERM does to a rollout pod with a replica (a template roll, an eviction):
    `rlscale rollout` passes it to `ray start --block`, which marks its node draining; Serve starts a
    replacement on the free slot, and the old replica finishes its request before it stops. (Last in
    the module: it stops one of the two pods.)"""
    import threading

    # One replica on one pod, the other pod's slot free (the first test left three planned, two running).
    s = client.scale(1)
    assert s.states == {"RUNNING": 1}, s
    (pod,) = s.pods
    (other,) = set(PODS) - {pod}
    retries_before = client.retries
    done = {}

    def run():
        # About 2 s of generation on 2 cores (measured: done 1.5 s after the SIGTERM sent at 0.5 s).
        done["out"] = client.generate([PROMPT] * 48, samples_per_prompt=4, max_new_tokens=400, seed=3)
        done["at"] = time.monotonic()

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    # As the kubelet stops the pod's container: SIGTERM to its first process alone.
    os.kill(two_pods[pod].pid, signal.SIGTERM)
    t.join(timeout=300)
    assert not t.is_alive() and len(done["out"]) == 48 and all(len(g) == 4 for g in done["out"])
    assert done["at"] > t0  # it was in flight when the pod was told to stop
    assert client.retries == retries_before  # no request died with the replica: it finished before it stopped
    s = _wait("the replica on the other pod", lambda: (x := client.serving()).pods == (other,)
              and x.states == {"RUNNING": 1} and x)
    assert two_pods[pod].wait(timeout=DRAIN_S + 30) == 0
    print(f"request done {done['at'] - t0:.1f} s and pod stopped {time.monotonic() - t0:.0f} s after "
          f"SIGTERM; serving {s}")
