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
