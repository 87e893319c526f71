"""A learner rank that dies takes the others down within seconds (trainer/gang.py), so the
StatefulSet restarts the whole gang from its last checkpoint instead of the survivors waiting
out the process group's 30-minute timeout."""

from __future__ import annotations

import re

import pytest

from rlscale.trainer.gang import EXIT_GANG

pytestmark = pytest.mark.slow


def _exit_delay(result) -> float:
    """Seconds from the gang being up to the survivor's last log line (it exits right after)."""
    up = float(re.search(r"GANG-UP ([0-9.]+)", result.stdout).group(1))
    stamps = [float(x) for x in re.findall(r"^(\d{10}\.\d+)", result.stdout, re.M)]
    return (max(stamps) if stamps else up) - up


@pytest.mark.parametrize("dies,survivor", [(0, 1), (1, 0)], ids=["rank0-dies", "follower-dies"])
def test_the_survivor_exits_for_a_gang_restart(small_model, tmp_path, run_ranks, dies, survivor):
    config = {"model_path": str(small_model), "zero_stage": 1, "micro_batch": 8, "lr": 1e-3}
    # Rank 0 would sleep 10 minutes if nothing noticed its follower's death.
    results = run_ranks("gang", {"config": config, "dies": dies, "wait": 600}, tmp_path, world_size=2,
                        timeout=180, expect_kill=True)
    assert results[dies].returncode == -9
    r = results[survivor]
    assert r.returncode == EXIT_GANG, r.stdout[-3000:]
    assert "GANG-SURVIVED" not in r.stdout
    what = "rank 0 does not answer" if dies == 0 else "rank 1 stopped its heartbeat"
    assert what in r.stdout, r.stdout[-3000:]
