"""A learner rank that dies takes the others down within seconds (trainer/gang.py), so the
StatefulSet restarts the whole gang from its last checkpoint instead of the survivors waiting
out the process group's 30-minute timeout."""

from __future__ import annotations

import time

import pytest

from rlscale.trainer.gang import EXIT_GANG

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("dies,survivor", [(0, 1), (1, 0)], ids=["rank0-dies", "follower-dies"])
def test_the_survivor_exits_for_a_gang_restart(small_model, tmp_path, run_ranks, dies, survivor, monkeypatch):
    monkeypatch.setenv("RLSCALE_GANG_INTERVAL", "1")  # 5 s and 30 s in a run
    monkeypatch.setenv("RLSCALE_GANG_PATIENCE", "8")
    config = {"model_path": str(small_model), "zero_stage": 1, "micro_batch": 8, "lr": 1e-3}
    # The survivor would sleep 10 minutes if nothing noticed the other's death.
    t0 = time.monotonic()
    results = run_ranks("gang", {"config": config, "dies": dies, "wait": 600}, tmp_path, world_size=2,
                        timeout=300, expect_kill=True)
    # Start-up (DeepSpeed, the model) plus detection: 2 x 1 s without rank 0, 8 s without a follower.
    assert time.monotonic() - t0 < 200
    assert results[dies].returncode == -9
    r = results[survivor]
    assert r.returncode == EXIT_GANG, r.stdout[-3000:]
    assert "GANG-SURVIVED" not in r.stdout
    what = "rank 0 does not answer" if dies == 0 else "rank 1 stopped its heartbeat"
    assert what in r.stdout, r.stdout[-3000:]


class _Head:
    """A fake GCS answering with a cluster id, or not at all."""

    def __init__(self):
        self.cluster, self.up = "aa" * 14, True

    def probe(self) -> str:
        if not self.up:
            raise ConnectionError("head down")
        return self.cluster


def _watch(head: _Head, **kw):
    from rlscale.trainer.gang import HeadWatch

    exits: list[int] = []
    w = HeadWatch(head.probe, interval=0.05, exit_fn=exits.append, **kw)
    w.start()
    return w, exits


def _wait(pred, timeout=5.0):
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end and not pred():
        time.sleep(0.02)
    return pred()


def test_a_replaced_ray_head_ends_rank_0_for_a_restart():
    from rlscale.trainer.gang import EXIT_GANG

    head = _Head()
    w, exits = _watch(head, patience=60)
    head.up = False  # the head pod killed: no answer for a while (less than the patience)...
    assert not _wait(lambda: exits, 0.3)
    head.up, head.cluster = True, "bb" * 14  # ...then a new head behind the same Service
    assert _wait(lambda: exits == [EXIT_GANG])
    w.stop()


def test_a_head_that_never_answers_again_ends_rank_0_after_the_patience():
    from rlscale.trainer.gang import EXIT_GANG

    head = _Head()
    w, exits = _watch(head, patience=0.3)
    assert not _wait(lambda: exits, 0.2)  # the same head, answering: nothing happens
    head.up = False
    assert _wait(lambda: exits == [EXIT_GANG])
    w.stop()


def test_the_head_watch_is_quiet_once_the_run_has_ended():
    from rlscale.trainer.gang import stop_head_watches

    head = _Head()
    w, exits = _watch(head, patience=0.1)
    stop_head_watches()  # what wait_for_termination does: the head goes to zero with the rest
    head.up = False
    assert not _wait(lambda: exits, 0.5)
