"""Weights through vLLM's weight transfer protocol on a real local Ray: replicas of the tiny model.

One module, one Ray: two replicas take updates from a `gloo` group (vLLM's nccl protocol with the wire
swapped), bit for bit alike and generating what transformers generates with those weights, while the
sender sends each byte once; a replica added later holds the model directory's weights until the next
publish forms a group with it; one replica built for `shm` (the ipc stand-in) takes the same weights from
shared memory; sleep and wake reach every replica."""

from __future__ import annotations

import time

import pytest

from .conftest import KV_CACHE_BYTES, decisive_state_dict, hf_greedy, hf_model

pytestmark = pytest.mark.slow

EOF_ID = 2
PROMPT = [1] + [4 + (i * 5) % 13 for i in range(40)]
BUCKET = 96 * 1024  # a few buckets per update for the tiny model


@pytest.fixture(scope="module")
def client(ray_cluster, model_dirs):
    from rlscale.rollout.engine import EngineConfig
    from rlscale.rollout.serve import RolloutClient, RolloutOptions

    c = RolloutClient.deploy(
        EngineConfig(model=model_dirs[0], kv_cache_bytes=KV_CACHE_BYTES, max_num_seqs=64, transfer_backend="gloo"),
        RolloutOptions(app_name="test-gloo", num_replicas=2, version_wait_s=30.0, sync_timeout_s=60.0,
                       bucket_bytes=BUCKET),
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


def test_updates_reach_every_replica_alike_and_the_sender_sends_each_byte_once(client, model_dirs):
    from rlscale.rollout.transfer.buckets import largest_bucket, metas, plan_buckets
    from rlscale.trainer.transfer.sources import TensorsSource

    w, other = decisive_state_dict(model_dirs[1], seed=1), decisive_state_dict(model_dirs[0], seed=0)
    res = client.publish_weights(1, w)
    assert (res.backend, res.replicas, res.formed) == ("gloo", 2, True), res
    assert res.bytes_sent == res.tensor_bytes  # once for both replicas: the chain forwards the rest
    assert "by gloo to 2 replicas" in res.describe()
    reference = digests(client, 2, 1)
    assert len(set(reference.values())) == 1

    meta = metas(TensorsSource(w).metadata())
    bound = largest_bucket(meta, plan_buckets(meta, BUCKET))
    assert len(plan_buckets(meta, BUCKET)) > 1
    for r, stats in res.receivers.items():  # a receiver holds one bucket at a time
        assert stats["received"] == res.tensor_bytes, (r, stats)
        assert 0 < stats["buffer_peak"] <= bound, (r, stats, bound)

    res = client.publish_weights(2, other)
    assert (res.replicas, res.formed) == (2, False), res  # the same members: the same group
    changed = digests(client, 2, 2)
    assert set(changed.values()).isdisjoint(reference.values())

    res = client.publish_weights(3, iter(w.items()))  # (name, tensor) pairs, as a learner yields them
    assert digests(client, 2, 3) == reference  # bit for bit the first update's weights
    out = client.generate([PROMPT] * 4, temperature=0.0, max_new_tokens=12, version=3)
    expected = hf_greedy(hf_model(w, model_dirs[1]), PROMPT, 12, EOF_ID)
    assert all(s.token_ids == expected and s.weights_version == 3 for g in out for s in g)


def test_a_replica_added_later_waits_for_the_next_publish_which_forms_a_group_with_it(client, model_dirs):
    before = set(client.replicas())
    client.scale(3)
    client.wait_replicas(3, timeout_s=300)
    (late,) = set(client.replicas()) - before
    assert client.behind() == [late]  # the model directory's weights until the next publish
    res = client.publish_weights(4, decisive_state_dict(model_dirs[0], seed=0))
    assert (res.replicas, res.formed) == (3, True), res
    assert client.behind() == []
    assert len(set(digests(client, 3, 4).values())) == 1


def test_sleep_and_wake_reach_every_replica(client):
    t0 = time.monotonic()
    client.sleep(level=2, timeout_s=60)
    client.wake_up(["weights"], timeout_s=60)
    client.wake_up(["kv_cache"], timeout_s=60)
    assert time.monotonic() - t0 < 30  # CPU engines: a round trip through each replica's command thread
    out = client.generate([PROMPT], max_new_tokens=2, version=4)
    assert out[0][0].weights_version == 4


def test_shm_the_ipc_stand_in_loads_the_same_weights_from_shared_memory(client, model_dirs):
    from rlscale.rollout.engine import EngineConfig
    from rlscale.rollout.serve import RolloutClient, RolloutOptions
    from rlscale.rollout.transfer.buckets import largest_bucket, metas, plan_buckets
    from rlscale.trainer.transfer.sources import TensorsSource

    w = decisive_state_dict(model_dirs[1], seed=1)
    client.scale(2)  # a rollout slot for this app's replica
    shm = RolloutClient.deploy(
        EngineConfig(model=model_dirs[0], kv_cache_bytes=KV_CACHE_BYTES, max_num_seqs=16, transfer_backend="shm"),
        RolloutOptions(app_name="test-shm", num_replicas=1, version_wait_s=30.0, sync_timeout_s=60.0,
                       bucket_bytes=BUCKET))
    try:
        shm.wait_replicas(1, timeout_s=300)
        res = shm.publish_weights(1, w)
        assert (res.backend, res.replicas) == ("shm", 1), res
        (stats,) = res.receivers.values()
        assert stats["received"] == res.tensor_bytes  # every byte from shared memory
        meta = metas(TensorsSource(w).metadata())
        # A bucket's copy at a time (the segment is refilled): a layer of this model is larger than BUCKET and
        # travels alone, so the bound is the largest bucket.
        assert 0 < stats["buffer_peak"] <= largest_bucket(meta, plan_buckets(meta, BUCKET))
        out = shm.generate([PROMPT] * 2, temperature=0.0, max_new_tokens=12, version=1)
        expected = hf_greedy(hf_model(w, model_dirs[1]), PROMPT, 12, EOF_ID)
        assert all(s.token_ids == expected for g in out for s in g)
    finally:
        shm.shutdown()
