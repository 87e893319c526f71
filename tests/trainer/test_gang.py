"""A learner rank that dies takes the others down within seconds (trainer/gang.py), so the
StatefulSet restarts the whole gang from its last checkpoint instead of the survivors waiting
out the process group's 30-minute timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlscale.roles import free_port
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


def test_pods_of_two_ranks_restart_together_when_one_rank_dies(small_model, tmp_path):
    """Two learner pods of two ranks (world 4), each a launcher (trainer/launcher.py): rank 3 dies;
    its launcher stops rank 2 and exits with rank 3's status (the pod restarts), and pod 0's rank 0
    sees ranks 2 and 3 fall silent and exits for a gang restart, which its launcher passes on."""
    worker = Path(__file__).with_name("learner_worker.py")
    args = tmp_path / "gang.json"
    config = {"model_path": str(small_model), "zero_stage": 1, "micro_batch": 8, "lr": 1e-3}
    args.write_text(json.dumps({"config": config, "dies": 3, "wait": 600}))
    argv = [sys.executable, str(worker), "gang", str(args)]
    code = f"import sys; from rlscale.trainer.launcher import launch; sys.exit(launch({argv!r}))"
    port, pods = str(free_port()), []
    for node in range(2):
        env = dict(os.environ, NODE_RANK=str(node), LOCAL_WORLD_SIZE="2", WORLD_SIZE="4", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, WORKER_THREADS="1", PYTHONUNBUFFERED="1", RLSCALE_GANG_INTERVAL="1",
                   RLSCALE_GANG_PATIENCE="8")
        log = open(tmp_path / f"pod{node}.log", "w")
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=log, stderr=subprocess.STDOUT)
        pods.append((proc, log))
    t0 = time.monotonic()
    try:
        codes = [p.wait(timeout=300) for p, _ in pods]
    finally:
        for p, log in pods:
            p.kill()
            log.close()
    logs = [(tmp_path / f"pod{n}.log").read_text() for n in range(2)]
    assert time.monotonic() - t0 < 240, logs
    assert codes[1] == 128 + signal.SIGKILL, logs[1][-3000:]  # rank 3's SIGKILL, passed on
    assert codes[0] == EXIT_GANG, logs[0][-3000:]
    assert "rank 2 stopped its heartbeat" in logs[0] or "rank 3 stopped its heartbeat" in logs[0], logs[0][-3000:]
    assert "GANG-SURVIVED" not in "".join(logs)


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
