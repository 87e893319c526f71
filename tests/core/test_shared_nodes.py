"""rlscale sweep's shared nodes: runs join the same head while it lives, and a lost head means new nodes."""

from __future__ import annotations

import signal

from rlscale.embedded import LocalRun, RoleProcess, SharedNodes


def _fake_nodes(tmp_path, shared: SharedNodes) -> tuple[RoleProcess, RoleProcess]:
    """Stand-ins for the head and a rollout process (the real ones are `ray start` processes)."""
    shared.local = LocalRun(cfg=None, run_dir=tmp_path)
    env = {"PATH": "/usr/bin:/bin"}
    head = shared.local.start(RoleProcess("ray-head", ["sleep", "60"], env, tmp_path / "head.log"))
    rollout = shared.local.start(RoleProcess("rollout-0", ["sleep", "60"], env, tmp_path / "rollout.log"))
    return head, rollout


def test_runs_join_the_same_address_while_the_head_lives(tmp_path):
    shared = SharedNodes(tmp_path / "nodes", app="rollout-x-sweep")
    first = shared.claim_address()
    assert first.startswith("127.0.0.1:") and not shared.up()
    head, rollout = _fake_nodes(tmp_path, shared)
    assert shared.up() and shared.head is head and shared.rollouts == [rollout]
    assert shared.claim_address() == first  # a second run joins the same cluster
    head.send(signal.SIGKILL)
    head.proc.wait(timeout=10)
    # The head is gone: the next run gets new nodes at a new address, and the old ones are stopped.
    second = shared.claim_address()
    assert not rollout.alive() and shared.local is None and shared.rollouts == []
    assert second.startswith("127.0.0.1:")
    shared.stop()  # nothing left to stop: a no-op


def test_stop_ends_every_process_of_the_nodes(tmp_path):
    shared = SharedNodes(tmp_path / "nodes", app="rollout-x-sweep")
    shared.claim_address()
    head, rollout = _fake_nodes(tmp_path, shared)
    shared.stop()
    assert not head.alive() and not rollout.alive() and not shared.up()


def test_nodes_pinned_for_another_core_split_are_not_reused(tmp_path):
    """A staleness sweep: the nodes a run generating ahead pinned to the rollout's core must not serve a
    synchronous run (every core for each phase), nor the reverse."""
    from types import SimpleNamespace

    from rlscale.runconfig import LocalOptions

    def cfg(cpus, threads):
        return SimpleNamespace(local=LocalOptions(rollout_cpus=cpus, rollout_cpu_threads=threads))

    shared = SharedNodes(tmp_path / "nodes", app="rollout-x-sweep")
    assert not shared.pinned_otherwise(cfg([0], 1))  # no nodes yet: nothing to compare
    shared.local = LocalRun(cfg=cfg([0], 1), run_dir=tmp_path)
    assert not shared.pinned_otherwise(cfg([0], 1))
    assert shared.pinned_otherwise(cfg(None, 2))
    assert shared.pinned_otherwise(cfg([0, 1], 2))
