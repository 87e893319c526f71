"""The rollout Serve application on a real local Ray: versions, scaling, replica loss."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import ray

from .conftest import KV_CACHE_BYTES, decisive_state_dict, hf_greedy, hf_model

pytestmark = pytest.mark.slow

EOS = 2
PROMPT = [1] + [4 + (i * 5) % 13 for i in range(40)]


@pytest.fixture(scope="module")
def client(ray_cluster, model_dirs):
    from rlscale.rollout.engine import EngineConfig
    from rlscale.rollout.serve import RolloutClient, RolloutOptions

    c = RolloutClient.deploy(
        EngineConfig(model=model_dirs[0], kv_cache_bytes=KV_CACHE_BYTES, max_num_seqs=64),
        # A request that reaches a replica behind the version it needs waits this long for the catch-up.
        RolloutOptions(app_name="test-rollout", num_replicas=1, metrics_port=0, version_wait_s=20.0),
    )
    yield c
    c.shutdown()


def _live(client) -> dict:
    """Registered replicas whose process is still alive."""
    live = {}
    for rid, info in client.replicas().items():
        try:
            os.kill(info["pid"], 0)
        except ProcessLookupError:
            continue
        live[rid] = info
    return live


def _in_flight(metrics_url: str) -> float:
    import urllib.request

    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    (line,) = [x for x in text.splitlines() if x.startswith("rlscale_rollout_requests_in_flight ")]
    return float(line.split()[1])


def _complete(results, n_prompts: int, n_samples: int) -> bool:
    return len(results) == n_prompts and all(
        len(g) == n_samples and all(s.token_ids for s in g) for g in results
    )


def test_requests_get_the_version_they_ask_for(client, model_dirs):
    # Version 0 is also the number of the model directory's weights; published weights
    # still replace them (the learner's copy is the truth, e.g. after a resume).
    weights = decisive_state_dict(model_dirs[1], seed=1)
    client.publish_weights(0, weights)
    out = client.generate([PROMPT] * 3, samples_per_prompt=2, temperature=0.0, max_new_tokens=12, version=0)
    assert {s.weights_version for g in out for s in g} == {0}
    expected = hf_greedy(hf_model(weights, model_dirs[1]), PROMPT, 12, EOS)
    assert all(s.token_ids == expected for g in out for s in g)

    # Publishing goes forward; the newest version may go again (a replica that fell behind catches up).
    client.publish_weights(1, weights)
    client.publish_weights(1, weights)
    with pytest.raises(Exception, match="older than the published"):
        client.publish_weights(0, weights)
    # A version nobody published cannot be served; the error says what to do.
    with pytest.raises(Exception, match="publishes each version"):
        client.generate([PROMPT], max_new_tokens=2, version=7)


def test_calls_from_several_threads_at_once_each_get_their_own_samples(client):
    """The multi-turn loop's overtaking sends generate calls from several threads, with one seed per prompt
    (rlscale.trainer.tools.overtaking): each call gets the samples it gets alone, and a call of all the prompts
    with their seeds as a list gets the same again."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = [PROMPT[: 10 + 3 * j] for j in range(6)]
    seeds = [500 + 7 * j for j in range(6)]

    def one(j: int) -> list[int]:
        (group,) = client.generate([prompts[j]], 1, temperature=1.0, top_p=1.0, max_new_tokens=8, seed=[seeds[j]])
        return group[0].token_ids

    alone = [one(j) for j in range(6)]
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(one, range(6)))
    assert together == alone and len({tuple(t) for t in alone}) > 1
    batch = client.generate(prompts, 1, temperature=1.0, top_p=1.0, max_new_tokens=8, seed=seeds)
    assert [g[0].token_ids for g in batch] == alone


def test_replica_metrics_are_served(client):
    import urllib.request

    client.generate([PROMPT] * 2, samples_per_prompt=2, max_new_tokens=4, version=0)
    (url,) = [i["metrics_url"] for i in _live(client).values()]
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    for name in (
        "rlscale_rollout_generated_tokens_total",
        "rlscale_rollout_samples_total",
        "rlscale_rollout_requests_in_flight",
        f"rlscale_rollout_weights_version {client.published_version:.1f}",
        "rlscale_rollout_weight_load_seconds_count",
        "rlscale_rollout_generation_seconds_bucket",
    ):
        assert name in text, name


def test_the_replica_answers_ready_on_its_metrics_port(client):
    """A rollout pod's readiness probe asks /ready on the replica's metrics port: 200 once the
    replica has loaded its engine and registered."""
    import urllib.request

    (url,) = [i["metrics_url"] for i in _live(client).values()]
    with urllib.request.urlopen(url.replace("/metrics", "/ready"), timeout=10) as r:
        assert (r.status, r.read()) == (200, b"ready\n")


def test_scaling_up_and_down_under_load_loses_no_request(client, model_dirs):
    # A new version before scaling up: replicas that start late hold the model directory's weights until the
    # catch-up the driver of a synchronous run makes before a request goes out (RolloutClient.on_behind).
    w = decisive_state_dict(model_dirs[0], seed=0)
    client.publish_weights(2, w)
    client.on_behind = catch_up(client, 2, w)
    results, errors, stop = [], [], threading.Event()

    def load():
        i = 0
        while not stop.is_set():
            try:
                out = client.generate(
                    [PROMPT[: 10 + j] for j in range(12)], samples_per_prompt=2,
                    max_new_tokens=24, seed=i, version=2,
                )
                results.append(out)
            except Exception as exc:  # recorded, then asserted empty
                errors.append(exc)
            i += 1

    def past_change() -> int:
        """Wait until a call sent after a change of the replica count has returned: each of the two
        threads may have one call out from before it, so three more results. (A call takes a fraction
        of a second; the fixed 2 s sleeps here before proved no more.)"""
        after, deadline = len(results) + 2, time.monotonic() + 120
        while len(results) <= after and not errors:
            assert time.monotonic() < deadline, "the load stopped returning"
            time.sleep(0.05)
        return len(results)

    workers = [threading.Thread(target=load) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        before = set(_live(client))
        client.scale(3)  # returns at once: Serve places the new replicas while the load goes on
        client.wait_replicas(3, timeout_s=300)
        late = {k: v for k, v in _live(client).items() if k not in before}
        served = past_change()
        # Down to 2, not 1: a scale-down under load all the same, and the next test finds its two
        # replicas up (its call took 38.6 s when it started the second, 24.2 s after: 2 cores,
        # `pytest tests/rollout/test_serve.py --durations=0`).
        client.scale(2)
        past_change()
    finally:
        stop.set()
        for t in workers:
            t.join(timeout=300)
    assert not errors, errors
    assert served >= 1 and len(results) > served  # load ran through both changes
    for out in results:
        assert _complete(out, 12, 2)
        assert {s.weights_version for g in out for s in g} == {2}
    assert client.replica_states() == {"RUNNING": 2}
    # The two late replicas started on the model directory's weights and took version 2 from a catch-up publish.
    assert [i["start_version"] for i in late.values()] == [0, 0], late
    loads = {r for r, v, _ in ray.get(client._store.loads.remote()) if v == 2}
    assert set(late) <= loads, (late, loads)


def catch_up(client, version: int, weights: dict):
    """What the driver of a synchronous run does before a request goes out while a replica is behind: publish
    the version it holds again (the generating threads of a test may ask at once: one publish at a time)."""
    lock = threading.Lock()

    def publish():
        with lock:
            if client.behind():
                client.publish_weights(version, weights)
    return publish


def test_a_killed_replicas_requests_complete_elsewhere(client, model_dirs):
    client.on_behind = catch_up(client, 2, decisive_state_dict(model_dirs[0], seed=0))
    client.scale(2)  # the scaling test above left two (this one alone starts the second)
    client.wait_replicas(2, timeout_s=300)
    client.on_behind()  # both replicas current before the load (the driver's previous request did it)
    # A replica the scale-down just removed may still have its process for a moment.
    deadline = time.monotonic() + 60
    while len(victims := list(_live(client).values())) != 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(victims) == 2, victims
    retries_before = client.retries
    done = {}

    def run():
        # Long enough that both replicas are mid-generation when one is killed.
        done["out"] = client.generate(
            [PROMPT] * 16, samples_per_prompt=4, max_new_tokens=160, seed=5, version=2
        )

    t = threading.Thread(target=run)
    t.start()
    # Kill a replica while it holds requests: its own gauge says when. (The router may
    # not know the newest replica yet, so whichever is busy first is the victim.)
    deadline, victim = time.monotonic() + 60, None
    while victim is None:
        assert time.monotonic() < deadline, "no replica received a request"
        victim = next((v for v in victims if _in_flight(v["metrics_url"]) >= 1), None)
        time.sleep(0.02)
    os.kill(victim["pid"], signal.SIGKILL)
    t.join(timeout=300)
    assert not t.is_alive()
    assert _complete(done["out"], 16, 4)
    assert client.retries > retries_before
    # Serve replaces the dead replica (once its health check notices); the replacement starts on the model
    # directory's weights and is caught up before the next request goes out.
    deadline, old = time.monotonic() + 180, {v["pid"] for v in victims}
    while not [i for i in _live(client).values() if i["pid"] not in old]:
        assert time.monotonic() < deadline, "the killed replica was never replaced"
        time.sleep(0.5)
    client.wait_replicas(2, timeout_s=180)
    assert client.behind() == [r for r, i in _live(client).items() if i["pid"] not in old]
    out = client.generate([PROMPT] * 4, max_new_tokens=4, seed=1, version=2)
    assert _complete(out, 4, 1) and client.behind() == []


def test_rollout_entrypoint_joins_the_cluster_with_one_rollout_slot(ray_cluster, tmp_path):
    import subprocess
    import sys

    from rlscale.runconfig import RunConfig

    ray = ray_cluster
    address = ray.get_runtime_context().gcs_address
    config = RunConfig(run="t", spec={"hardware": {"accelerator": "cpu"}}, ray_address=address).save(
        tmp_path / "run.json")
    slots = ray.cluster_resources().get("rollout", 0)
    # As the runner or a pod starts it: nothing inherited from this test's ray.init,
    # which sets RAY_AUTH_MODE=token in this process.
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlscale.rollout.entrypoint", "--config", str(config)],
        start_new_session=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while ray.cluster_resources().get("rollout", 0) < slots + 1:
            assert proc.poll() is None, f"rlscale rollout exited with {proc.returncode}"
            assert time.monotonic() < deadline, "the rollout worker never joined"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        deadline = time.monotonic() + 60
        while ray.cluster_resources().get("rollout", 0) > slots:
            assert time.monotonic() < deadline, "the rollout slot outlived its process"
            time.sleep(0.2)
        # Nothing it started (raylet, workers) is left in its session.
        left = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True)
        assert left.stdout.split() == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
