"""Weights by broadcast on a real local Ray: two replicas of the tiny model in one weight group.

One module, one Ray, one app: broadcast and object-store updates of the same weights leave the replicas'
parameters bit for bit the same, requests then need no pull, and a replica added after the group formed
catches up from the object store and is in the group the next publish forms."""

from __future__ import annotations

import time

import pytest

from .conftest import KV_CACHE_BYTES, decisive_state_dict, hf_greedy, hf_model

pytestmark = pytest.mark.slow

EOF_ID = 2
PROMPT = [1] + [4 + (i * 5) % 13 for i in range(40)]


@pytest.fixture(scope="module")
def client(ray_cluster, model_dirs):
    from rlscale.rollout.engine import EngineConfig
    from rlscale.rollout.serve import RolloutClient, RolloutOptions

    c = RolloutClient.deploy(
        EngineConfig(model=model_dirs[0], kv_cache_bytes=KV_CACHE_BYTES, max_num_seqs=64),
        RolloutOptions(app_name="test-bcast", num_replicas=2, version_wait_s=30.0, weight_sync="auto",
                       sync_timeout_s=60.0, form_timeout_s=30.0, sync_chunk_bytes=64 * 1024),
    )
    c.wait_replicas(2, timeout_s=300)
    yield c
    c.shutdown()


def digests(client, n: int, version: int, timeout_s: float = 120.0) -> dict[str, str]:
    """Replica id -> parameter hash, once `n` replicas answered at `version`."""
    seen: dict[str, dict] = {}
    deadline = time.monotonic() + timeout_s
    while len([d for d in seen.values() if d["version"] == version]) < n:
        assert time.monotonic() < deadline, f"replicas at v{version}: {seen}"
        d = client._handle.weights_digest.remote().result(timeout_s=60)
        seen[d["replica"]] = d
        time.sleep(0.05)
    return {k: d["digest"] for k, d in seen.items() if d["version"] == version}


def sources(client, version: int, n: int = 0, timeout_s: float = 60.0) -> dict[str, str]:
    """Replica id -> how it loaded `version` (waiting until `n` replicas recorded theirs: a replica records
    its load after the broadcast's last bucket, which can be after the learner's send returned)."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = {r: s for r, v, s, _ in ray_get(client._store.loads.remote()) if v == version}
        if len(out) >= n or time.monotonic() > deadline:
            return out
        time.sleep(0.05)


def ray_get(ref):
    import ray

    return ray.get(ref)


def by_object_store(client, on: bool) -> None:
    client.options.weight_sync = "object-store" if on else "auto"  # the next publish follows it


def test_broadcast_and_object_store_updates_leave_the_same_weights(client, model_dirs):
    w, other = decisive_state_dict(model_dirs[1], seed=1), decisive_state_dict(model_dirs[0], seed=0)
    by_object_store(client, True)
    res = client.publish_weights(1, w)
    assert res.method == "object-store" and res.bytes_sent == 0
    reference = digests(client, 2, 1)  # both replicas pulled v1 ahead of any request
    assert set(sources(client, 1).values()) == {"object-store"}

    by_object_store(client, False)
    res = client.publish_weights(2, other)
    assert (res.method, res.replicas, res.fallback) == ("broadcast", 2, []), res
    assert res.bytes_sent == res.tensor_bytes  # the learner sends each byte once for both replicas
    assert "by broadcast to 2 replicas" in res.describe()
    changed = digests(client, 2, 2)
    assert set(changed.values()).isdisjoint(reference.values())

    res = client.publish_weights(3, iter(w.items()))  # (name, tensor) pairs, as iter_weights yields them
    assert (res.method, res.replicas) == ("broadcast", 2), res
    # Both replicas hold v3 from the broadcast at once: no pull, bit for bit the object store's copy.
    assert sources(client, 3) == dict.fromkeys(reference, "broadcast")
    assert digests(client, 2, 3) == reference
    out = client.generate([PROMPT] * 4, temperature=0.0, max_new_tokens=12, version=3)
    expected = hf_greedy(hf_model(w, model_dirs[1]), PROMPT, 12, EOF_ID)
    assert all(s.token_ids == expected and s.weights_version == 3 for g in out for s in g)
    assert sources(client, 3) == dict.fromkeys(reference, "broadcast")  # the requests pulled nothing


def test_a_replica_added_later_catches_up_then_joins_the_next_group(client, model_dirs):
    before = set(client.replicas())
    client.scale(3)
    client.wait_replicas(3, timeout_s=300)
    (late,) = set(client.replicas()) - before
    assert client.replicas()[late]["start_version"] == 3
    assert sources(client, 3)[late] == "object-store"  # caught up from the object store at start

    epoch = client._publisher.sender.epoch
    res = client.publish_weights(4, decisive_state_dict(model_dirs[0], seed=0))
    assert (res.method, res.replicas) == ("broadcast", 3), res
    assert client._publisher.sender.epoch == epoch + 1  # the serving set changed: a new group
    assert sources(client, 4, n=3) == dict.fromkeys([*before, late], "broadcast")
    assert len(set(digests(client, 3, 4).values())) == 1


def test_sleep_and_wake_reach_every_replica(client):
    t0 = time.monotonic()
    client.sleep(timeout_s=60)
    client.wake_up(timeout_s=60)
    assert time.monotonic() - t0 < 30  # CPU engines: a round trip through each replica's sync thread
    out = client.generate([PROMPT], max_new_tokens=2, version=4)
    assert out[0][0].weights_version == 4
