"""rlscale's weight transfer backends without Ray or a vLLM model: the gloo engines of a trainer and of
replicas in threads of this process, the buckets, the members' ranks, and the driver's colocated order."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from rlscale.rollout.transfer import gloo
from rlscale.rollout.transfer.buckets import Meta, bucket_nbytes, largest_bucket, metas, plan_buckets
from rlscale.rollout.transfer.control import Member, member_init_infos
from rlscale.trainer.transfer.gloo_trainer import GlooTrainerInitInfo, GlooTrainerWeightTransferEngine
from rlscale.trainer.transfer.sources import TensorsSource

# vLLM's weight-transfer base classes cost 3-7 s to import and some cases wait out a timeout: `make test`,
# not `make unit`.
pytestmark = pytest.mark.slow


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(37, 16, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16, generator=g).to(torch.bfloat16),
        "model.layers.0.self_attn.q_proj.bias": torch.randn(16, generator=g).half(),
        "model.layers.0.mlp.up_proj.weight": torch.randn(32, 16, generator=g),
        "model.layers.1.mlp.up_proj.weight": torch.randn(32, 16, generator=g),
        "model.layers.1.mask": torch.rand(5, generator=g) > 0.5,
        "model.norm.weight": torch.randn(16, generator=g),
    }


def test_buckets_end_at_layer_boundaries_and_a_large_layer_travels_alone():
    meta = metas(TensorsSource(weights()).metadata())
    sizes = [m.nbytes for m in meta]
    layer0 = sum(sizes[1:4])
    assert plan_buckets(meta, 10**9) == [(0, 7)]
    # A bucket smaller than layer 0: layer 0 alone, never split; the embedding before it, the rest after.
    assert plan_buckets(meta, layer0 - 1) == [(0, 1), (1, 4), (4, 7)]  # layer 1 and the norm fit in one
    assert plan_buckets(meta, sizes[0] + layer0) == [(0, 4), (4, 7)]
    with pytest.raises(ValueError, match="together"):
        plan_buckets([meta[1], meta[4], meta[2]], 10**9)  # layer 0, layer 1, layer 0 again


def test_group_members_take_consecutive_ranks_after_the_trainer():
    members = [Member("a", 1), Member("b", 4), Member("c", 2)]
    infos = member_init_infos(members, {"master_port": 5, "rank_offset": 1, "world_size": 8})
    assert [infos[m]["rank_offset"] for m in "abc"] == [1, 2, 6]
    assert member_init_infos(members, {"packed": True}) == dict.fromkeys("abc", {"packed": True})


class FakeModel:
    def __init__(self):
        self.loaded: dict[str, torch.Tensor] = {}

    def load_weights(self, items):
        for name, t in items:
            self.loaded[name] = t.clone()  # the engine loads from views of its receive buffer


class ThreadClient:
    """vLLM's client protocol straight to worker engines in threads (what ReplicaClient does over Ray)."""

    def __init__(self, engines, die_after_init: int | None = None):
        self.engines, self.die = engines, die_after_init
        self.version = None

    def _each(self, fn, payloads):
        errors = []

        def run(e, p):
            try:
                fn(e, p)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(e, p)) for e, p in zip(self.engines, payloads, strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if errors:
            raise errors[0]

    def init_weight_transfer_engine(self, info):
        infos = member_init_infos([Member(str(i)) for i in range(len(self.engines))], info)
        self._each(lambda e, p: e.init_transfer_engine(e.parse_init_info(p)), list(infos.values()))

    def start_weight_update(self):
        self._each(lambda e, p: e.start_weight_update(), [None] * len(self.engines))

    def update_weights(self, info):
        engines = self.engines if self.die is None else [e for i, e in enumerate(self.engines) if i != self.die]
        ThreadClient(engines)._each(lambda e, p: e.receive_weights(e.parse_update_info(p)), [info] * len(engines))

    def finish_weight_update(self, weight_version=None):
        self._each(lambda e, p: e.finish_weight_update(), [None] * len(self.engines))


@pytest.fixture(autouse=True)
def no_layerwise(monkeypatch):
    monkeypatch.setattr(gloo, "layerwise_start", lambda model: None)
    monkeypatch.setattr(gloo, "layerwise_finish", lambda model, cfg: None)


def replicas(n: int) -> list[gloo.GlooWeightTransferEngine]:
    cfg = SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_index=0, world_size=1, rank=0),
                          model_config=None)
    return [gloo.GlooWeightTransferEngine(None, cfg, torch.device("cpu"), FakeModel()) for _ in range(n)]


def test_gloo_reaches_every_replica_bit_for_bit_and_the_trainer_sends_each_byte_once():
    w = weights(1)
    engines = replicas(3)
    source = TensorsSource(w)
    meta = metas(source.metadata())
    bucket = bucket_nbytes(meta, (0, 4))
    info = GlooTrainerInitInfo(rank=0, world_size=4, bucket_bytes=bucket, chunk_bytes=64, timeout_s=30)
    trainer = GlooTrainerWeightTransferEngine.trainer_init(info, client=ThreadClient(engines), source=source)
    trainer.send_weights()
    total = bucket_nbytes(meta, (0, 4)) + bucket_nbytes(meta, (4, 7))  # the wire's bytes: aligned starts
    assert total < sum(m.nbytes for m in meta) + 16 * len(meta)
    assert trainer.last.bytes == total and trainer.last.buckets == [bucket, total - bucket]
    for i, e in enumerate(engines):
        assert set(e.model.loaded) == set(w)
        assert all(torch.equal(e.model.loaded[k], v) for k, v in w.items())
        assert e.stats.received == total and e.stats.buffer_peak == bucket  # one bucket at a time
        assert e.stats.forwarded == (total if i < 2 else 0)  # each forwards to the next; the last to nobody
    source.items = list(weights(2).items())  # the next round re-iterates the source
    trainer.send_weights()
    assert all(torch.equal(engines[2].model.loaded[k], v) for k, v in weights(2).items())


def test_a_replica_that_stops_taking_part_fails_the_send_instead_of_hanging_it():
    engines = replicas(2)
    info = GlooTrainerInitInfo(rank=0, world_size=3, bucket_bytes=256, chunk_bytes=64, timeout_s=3)
    trainer = GlooTrainerWeightTransferEngine.trainer_init(
        info, client=ThreadClient(engines, die_after_init=1), source=TensorsSource(weights()))
    with pytest.raises(Exception):  # noqa: B017 - gloo's timeout or the first replica's, whichever comes first
        trainer.send_weights()


def test_a_source_that_disagrees_with_its_metadata_is_refused():
    engines = replicas(1)
    src = TensorsSource(weights())
    info = GlooTrainerInitInfo(rank=0, world_size=2, bucket_bytes=10**6, timeout_s=5)
    trainer = GlooTrainerWeightTransferEngine.trainer_init(info, client=ThreadClient(engines), source=src)
    src.metadata = lambda: [Meta("model.embed_tokens.weight", "float16", (37, 16))]  # declared otherwise
    with pytest.raises(ValueError, match="metadata declared"):
        trainer.send_weights()


def test_the_driver_hands_the_accelerator_over_in_the_colocated_order(caplog):
    from rlscale.trainer.driver import Driver
    from rlscale.trainer.transfer.publisher import SyncResult

    calls = []

    class Rollout:
        weights_on_device, backend = False, "shm"

        def publish_weights(self, version, weights):
            calls.append(("publish", version, sorted(weights)[0]))
            return SyncResult(version, "shm", replicas=1, seconds=0.41, tensor_bytes=2**20)

        def sleep(self, level=1):
            calls.append(f"sleep{level}")

        def wake_up(self, tags=None):
            calls.append(f"wake:{','.join(tags)}")

    learner = SimpleNamespace(export_weights=lambda: weights(), reload_states=lambda: calls.append("reload"),
                              offload_states=lambda: calls.append("offload"))
    d = SimpleNamespace(learner=learner, rollout=Rollout(), state=SimpleNamespace(version=3),
                        plan=SimpleNamespace(placement="disaggregated"), _source=None, _trainer=None)
    for name in ("_colocated", "_weight_source"):
        setattr(d, name, getattr(Driver, name).__get__(d))
    with caplog.at_level("INFO", logger="rlscale.driver"):
        Driver.publish(d)
    assert calls == [("publish", 3, "model.embed_tokens.weight")]
    assert "weights v3 by shm to 1 replica in 0.41 s (1.0 MiB)" in caplog.text
    for step in (Driver._hand_to_learner, Driver._hand_to_rollout, Driver._ready_to_generate):
        step(d)  # disaggregated: nothing
    assert len(calls) == 1
    d.plan.placement = "colocated"
    Driver._hand_to_learner(d)
    Driver._hand_to_rollout(d)
    Driver._ready_to_generate(d)
    assert calls[1:] == ["sleep2", "reload", "offload", "wake:weights", "wake:kv_cache"]


def test_shm_maps_each_bucket_in_place_and_a_rank_clears_its_stale_segments(monkeypatch):
    import os
    import subprocess
    from multiprocessing import shared_memory
    from pathlib import Path

    from rlscale.rollout.transfer import shm
    from rlscale.trainer.transfer.shm_trainer import ShmTrainerInitInfo, ShmTrainerWeightTransferEngine

    monkeypatch.setattr(shm, "layerwise_start", lambda model: None)
    monkeypatch.setattr(shm, "layerwise_finish", lambda model, cfg: None)
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid no process has now
    stale = shared_memory.SharedMemory(name=f"rlscale-w-{dead.pid}-stale", create=True, size=64)
    stale.close()  # left behind by a trainer that crashed: only its name in /dev/shm
    alive = shared_memory.SharedMemory(name=f"rlscale-w-{os.getppid()}-alive", create=True, size=64)
    cfg = SimpleNamespace(parallel_config=None, model_config=None)
    (worker,) = engines = [shm.ShmWeightTransferEngine(None, cfg, torch.device("cpu"), FakeModel())]
    w = weights(3)
    trainer = ShmTrainerWeightTransferEngine.trainer_init(
        ShmTrainerInitInfo(rank=0, bucket_bytes=2048), client=ThreadClient(engines), source=TensorsSource(w))
    trainer.send_weights()
    assert not Path(f"/dev/shm/rlscale-w-{dead.pid}-stale").exists()
    assert Path(f"/dev/shm/{alive.name}").exists()  # a live trainer's (another run on this machine) stays
    alive.close()
    alive.unlink()
    assert all(torch.equal(worker.model.loaded[k], v) for k, v in w.items())
    # Each bucket copied out of the segment (the next one refills it): one bucket held at a time, the largest
    # being layer 0, which is larger than 2048 bytes and travels alone.
    meta = metas(TensorsSource(w).metadata())
    assert worker.stats.buffer_peak == largest_bucket(meta, plan_buckets(meta, 2048)) > 2048
    assert worker.stats.received == trainer.last_bytes > 0
    name = trainer.seg.name
    trainer.shutdown()
    assert not Path(f"/dev/shm/{name}").exists()


def test_a_member_that_dies_ends_the_wait_at_once_and_abort_skips_it(monkeypatch):
    """A replica killed between two updates (its pod deleted) never answers: the wait ends when the replica
    is no longer alive, not after the phase's timeout (the real node's faults run waited 120 s three times)."""
    from rlscale.rollout.transfer.control import ReplicaClient, WeightTransferError, wait_for_acks

    acks = {"a": {"result": 1}}
    t0 = time.monotonic()
    with pytest.raises(WeightTransferError, match="replica\\(s\\) b gone"):
        wait_for_acks("start", {"a", "b"}, lambda: acks, timeout_s=30, alive=lambda: ["a"], alive_every_s=0.05)
    assert time.monotonic() - t0 < 5
    # Alive but slow: the timeout still decides; no liveness answer (or a failing one) is no news.
    for alive in (lambda: ["a", "b"], lambda: None, lambda: 1 / 0):
        t0 = time.monotonic()
        with pytest.raises(WeightTransferError, match="no answer from replica\\(s\\) b in 0 s"):
            wait_for_acks("start", {"a", "b"}, lambda: acks, timeout_s=0.3, alive=alive, alive_every_s=0.05)
        assert time.monotonic() - t0 >= 0.3
    assert wait_for_acks("finish", {"a"}, lambda: acks, timeout_s=1, alive=lambda: []) == {"a": 1}

    # abort and shutdown post to the members still alive only; the other phases to every member.
    posted = []

    class Store:
        class post:  # noqa: N801 - the Ray actor method's shape: .remote(...)
            @staticmethod
            def remote(op, payloads):
                posted.append((op, sorted(payloads)))
                return len(posted)

        class acks:  # noqa: N801
            @staticmethod
            def remote(seq):
                return {r: {"result": None} for r in posted[seq - 1][1]}

    import ray

    monkeypatch.setattr(ray, "get", lambda x: x)  # the stand-in store answers in place of Ray's object refs
    client = ReplicaClient(Store, [Member("a"), Member("b")], timeout_s=1, alive=lambda: ["a"])
    client.abort()
    client.shutdown_weight_transfer_engine()
    client.finish_weight_update("3")
    assert posted == [("abort", ["a"]), ("shutdown", ["a"]), ("finish", ["a", "b"])]
