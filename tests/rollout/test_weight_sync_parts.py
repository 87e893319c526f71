"""The weight group without Ray or vLLM: a sender and receivers in threads of this process, over gloo."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rlscale.rollout.weight_sync import Publisher, Receiver, Sender, SyncResult, Transport, WeightSyncError


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(37, 16, generator=g),
        "layer.0.w": torch.randn(16, 16, generator=g).to(torch.bfloat16),
        "layer.0.b": torch.randn(16, generator=g).half(),
        "steps": torch.tensor(seed + 7, dtype=torch.int64),  # a scalar
        "mask": torch.rand(5, generator=g) > 0.5,
        "empty": torch.empty(0, 4),
    }


def nbytes(ws: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ws.values())


class Replica(threading.Thread):
    """A receiver thread: joins each group it is announced in and records every update it receives."""

    def __init__(self, rid: str, die_after: int | None = None):
        super().__init__(daemon=True)
        self.rid, self.die_after = rid, die_after
        self.announcements: list[dict] = []
        self.updates: list[tuple[int, dict[str, torch.Tensor]]] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self):
        seen, rx = 0, None
        while not self.stop.is_set():
            if len(self.announcements) > seen:
                seen = len(self.announcements)
                rx = Receiver(self.announcements[-1], self.rid)
                rx = rx if rx.member else None
            try:
                v = rx.poll() if rx is not None else None
            except RuntimeError:  # its sender closed that group's store (re-formed): wait for the next
                rx = v = None
            if v is not None:
                if self.die_after is not None:
                    # Take some tensors, then vanish mid-stream (closes its sockets).
                    for _ in range(self.die_after):
                        meta = rx.store.get(f"u/{rx.seq}/0")
                        assert meta
                    rx.close()
                    return
                try:
                    got = dict(rx.receive())
                except RuntimeError as exc:  # as ReplicaSync: leave the group, wait for the next
                    self.error, rx = exc, None
                    continue
                self.updates.append((v, got))
                rx.ack(v, rx.transport.forward_error)  # as ReplicaSync: an error cuts the chain here
            time.sleep(0.005)


def publisher(mode: str, replicas: dict[str, Replica], puts: list, **kw) -> Publisher:
    sender = Sender("127.0.0.1", "gloo", timeout_s=kw.pop("timeout_s", 10.0), form_timeout_s=kw.pop("form_s", 5.0),
                    chunk_bytes=kw.pop("chunk_bytes", 100))

    def announce(a):
        for rid in a["candidates"]:
            replicas[rid].announcements.append(a)

    return Publisher(mode, lambda: list(replicas), announce, lambda v, t: puts.append((v, t)), sender,
                     put_behind=kw.pop("put_behind", False))


def equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.view(-1).view(torch.uint8) if x.numel() else x,
                                                                 y.view(-1).view(torch.uint8) if y.numel() else y)
        for x, y in zip(a.values(), b.values(), strict=True))


@pytest.fixture
def replicas():
    made: dict[str, Replica] = {}
    yield made
    for r in made.values():
        r.stop.set()
        if r.is_alive():
            r.join(timeout=20)


def test_a_broadcast_reaches_every_replica_bit_for_bit_and_the_sender_sends_each_byte_once(replicas):
    puts: list = []
    sent = {}
    for n in (1, 3):
        replicas.clear()
        replicas.update({f"r{i}": Replica(f"r{i}") for i in range(n)})
        for r in replicas.values():
            r.start()
        pub = publisher("auto", replicas, puts)
        ws = weights(n)
        res = pub.publish(n, iter(ws.items()))  # a generator, as iter_weights yields
        assert (res.method, res.replicas, res.fallback) == ("broadcast", n, [])
        assert res.tensor_bytes == nbytes(ws)
        sent[n] = res.bytes_sent
        for r in replicas.values():
            assert [v for v, _ in r.updates] == [n]
            assert equal(r.updates[0][1], ws)
        # The object-store copy holds the same tensors, for replicas outside the group.
        assert puts[-1][0] == n and equal(puts[-1][1], ws)
        for r in replicas.values():
            r.stop.set()
    # Chained: the learner's bytes do not grow with the replica count.
    assert sent[1] == nbytes(weights(1)) and sent[3] == nbytes(weights(3))


def test_the_group_reforms_when_the_serving_set_changes(replicas):
    puts: list = []
    replicas.update({"a": Replica("a"), "b": Replica("b")})
    for r in replicas.values():
        r.start()
    pub = publisher("auto", replicas, puts, put_behind=True)
    pub.publish(1, weights(1))
    assert pub.sender.epoch == 1
    pub.publish(2, weights(2))
    assert pub.sender.epoch == 1  # same members: the same group
    pub.flush()  # the object-store copies were put behind the broadcasts, in order
    assert [v for v, _ in puts] == [1, 2] and equal(puts[1][1], weights(2))
    replicas["c"] = Replica("c")
    replicas["c"].start()
    res = pub.publish(3, weights(3))
    assert pub.sender.epoch == 2 and res.replicas == 3
    assert [v for v, _ in replicas["c"].updates] == [3]
    assert [v for v, _ in replicas["a"].updates] == [1, 2, 3]
    assert equal(replicas["c"].updates[-1][1], weights(3))


def test_a_replica_that_does_not_answer_is_left_to_the_object_store(replicas):
    puts: list = []
    replicas.update({"a": Replica("a"), "mute": Replica("mute")})
    replicas["a"].start()  # "mute" never runs
    pub = publisher("auto", replicas, puts, form_s=1.0)
    res = pub.publish(1, weights(1))
    assert (res.method, res.replicas, res.fallback) == ("broadcast", 1, ["mute"])
    assert "1 catch up from the object store" in res.describe()
    assert equal(puts[-1][1], weights(1))
    # Not asked again while the serving set stays the same.
    t0 = time.monotonic()
    assert pub.publish(2, weights(2)).replicas == 1
    assert time.monotonic() - t0 < 1.0


def test_a_replica_dying_mid_broadcast_does_not_hang_the_sender(replicas):
    puts: list = []
    # Chained a -> dies -> z: "a" loads, cannot forward, says so; nothing reaches "z", and the sender does
    # not wait for it.
    replicas.update({"a": Replica("a"), "dies": Replica("dies", die_after=1), "z": Replica("z")})
    for r in replicas.values():
        r.start()
    pub = publisher("auto", replicas, puts, timeout_s=6.0)
    consumed = []

    def items():
        for k, v in weights(1).items():
            consumed.append(k)
            yield k, v

    t0 = time.monotonic()
    res = pub.publish(1, items())
    assert time.monotonic() - t0 < 5  # not the 6 s timeout: "a" said the chain ends at it
    assert consumed == list(weights(1))  # the learner's iterator always runs to its end
    assert (res.method, res.replicas, res.fallback) == ("broadcast", 1, ["dies", "z"])
    assert equal(replicas["a"].updates[0][1], weights(1)) and equal(puts[-1][1], weights(1))
    # The broken group is formed again at the next publish.
    replicas.pop("dies")
    res = pub.publish(2, weights(2))
    assert (res.method, res.replicas) == ("broadcast", 2) and pub.sender.epoch == 2


def test_broadcast_mode_fails_clearly_and_auto_falls_back_when_no_group_forms(replicas):
    replicas["mute"] = Replica("mute")
    puts: list = []
    with pytest.raises(WeightSyncError, match="broadcast required"):
        publisher("broadcast", replicas, puts, form_s=0.5).publish(1, weights(1))
    pub = publisher("auto", replicas, puts, form_s=0.5)
    res = pub.publish(1, weights(1))
    assert res.method == "object-store" and res.fallback == ["mute"] and equal(puts[-1][1], weights(1))
    assert "by object store" in res.describe()
    t0 = time.monotonic()  # the same serving set: no second wait for it
    assert pub.publish(2, weights(2)).method == "object-store" and time.monotonic() - t0 < 0.4


def test_object_store_mode_forms_no_group():
    puts: list = []
    res = Publisher("object-store", lambda: ["x"], lambda a: pytest.fail("announced"),
                    lambda v, t: puts.append((v, t))).publish(4, list(weights(4).items()))
    assert (res.method, res.bytes_sent) == ("object-store", 0) and equal(puts[0][1], weights(4))
    with pytest.raises(ValueError, match="weight_sync"):
        Publisher("bcast", list, print, print)


def test_describe_names_the_method_and_the_replicas():
    r = SyncResult(3, "broadcast", replicas=2, seconds=0.41, tensor_bytes=2**20)
    assert r.describe().startswith("weights v3 by broadcast to 2 replicas in 0.41 s")


def test_chunks_cover_the_tensor():
    t = Transport(None, 0, 2, "gloo", chunk_bytes=7)
    flat = torch.arange(20, dtype=torch.uint8)
    assert torch.equal(torch.cat(t._chunks(flat)), flat) and len(t._chunks(flat)) == 3


def test_the_driver_streams_the_learners_weights_and_sleeps_the_rollout_only_when_colocated(caplog):
    from types import SimpleNamespace

    from rlscale.trainer.driver import Driver

    calls = []

    class Rollout:
        weights_on_device = False

        def publish_weights(self, version, weights):
            calls.append(("publish", version, next(iter(weights))[0]))  # takes one item, leaves the rest
            return SyncResult(version, "broadcast", replicas=2, seconds=0.41)

        def sleep(self):
            calls.append("sleep")

        def wake_up(self):
            calls.append("wake_up")

    def iter_weights(device="cpu"):
        try:
            yield from weights(0).items()
        finally:
            calls.append("closed")  # the driver closes what publish left, so ZeRO-3 followers finish

    d = SimpleNamespace(learner=SimpleNamespace(iter_weights=iter_weights), rollout=Rollout(),
                        state=SimpleNamespace(version=3), plan=SimpleNamespace())
    with caplog.at_level("INFO", logger="rlscale.driver"):
        Driver.publish(d)
    assert calls == [("publish", 3, "embed.weight"), "closed"]
    assert "weights v3 by broadcast to 2 replicas in 0.41 s" in caplog.text
    Driver._rollout_awake(d, False)  # disaggregated (the default): nothing
    d.plan.placement = "colocated"
    Driver._rollout_awake(d, False)
    Driver._rollout_awake(d, True)
    assert calls[2:] == ["sleep", "wake_up"]
