"""The learner pod's launcher (trainer/launcher.py): G rank processes with their environment, a rank
that fails takes the others down with its exit code, the pod's SIGTERM reaches every rank; and two
launchers of two ranks form one gloo world of four."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from rlscale.roles import free_port
from rlscale.trainer.launcher import LAUNCHED_ENV, Launcher, Layout, is_launcher


def _script(tmp_path, body: str) -> list[str]:
    path = tmp_path / "rank.py"
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def test_each_rank_gets_its_rank_local_rank_and_world(tmp_path):
    argv = _script(tmp_path, """
        import json, os, sys
        keys = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR")
        out = os.path.join(os.environ["OUT"], "rank-" + os.environ["LOCAL_RANK"] + ".json")
        json.dump({k: os.environ.get(k) for k in keys}, open(out, "w"))
    """)
    env = {**os.environ, "OUT": str(tmp_path), "MASTER_ADDR": "pod-0"}
    code = Launcher(argv, Layout(node_rank=1, local_world=2, world_size=4), env).run()
    assert code == 0
    got = [json.loads((tmp_path / f"rank-{i}.json").read_text()) for i in range(2)]
    assert got == [{"RANK": str(2 + i), "LOCAL_RANK": str(i), "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4",
                    "NODE_RANK": "1", "MASTER_ADDR": "pod-0"} for i in range(2)]


def test_a_layout_comes_from_the_pods_environment_and_a_rank_is_no_launcher():
    pod = {"NODE_RANK": "3", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "8"}
    assert Layout.from_env(pod) == Layout(3, 2, 8)
    assert is_launcher(pod)
    assert not is_launcher({**pod, LAUNCHED_ENV: "1"})  # the ranks it starts
    assert not is_launcher({"RANK": "0", "WORLD_SIZE": "2"})  # one rank a pod: the process is the rank
    assert Layout(3, 2, 8).rank_env(1)["RANK"] == "7"


def test_a_failing_rank_takes_the_other_down_and_its_code_is_the_launchers(tmp_path):
    argv = _script(tmp_path, """
        import os, sys, time
        if os.environ["LOCAL_RANK"] == "1":
            sys.exit(7)
        time.sleep(120)
    """)
    launcher = Launcher(argv, Layout(0, 2, 2), grace_s=0.5)
    t0 = time.monotonic()
    assert launcher.run() == 7
    assert time.monotonic() - t0 < 30
    assert launcher.procs[0].returncode == -signal.SIGKILL  # killed, not left running
    assert all(p.poll() is not None for p in launcher.procs)


def test_sigterm_reaches_every_rank_once_and_a_clean_stop_exits_0(tmp_path):
    argv = _script(tmp_path, """
        import os, signal, sys, time
        out = os.path.join(os.environ["OUT"], "term-" + os.environ["LOCAL_RANK"])
        def stop(signum, frame):
            with open(out, "a") as f:
                f.write("x")
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        open(os.path.join(os.environ["OUT"], "up-" + os.environ["LOCAL_RANK"]), "w").close()
        time.sleep(120)
    """)
    env = {**os.environ, "OUT": str(tmp_path), "NODE_RANK": "0", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"}
    code = f"import sys; from rlscale.trainer.launcher import launch; sys.exit(launch({argv!r}))"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"up-{i}").exists() for i in range(2)):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert [(tmp_path / f"term-{i}").read_text() for i in range(2)] == ["x", "x"]


@pytest.mark.slow  # seconds of subprocesses or models: `make test`, not `make unit`
def test_two_launchers_of_two_ranks_are_one_gloo_world_of_four(tmp_path):
    argv = _script(tmp_path, """
        import os
        from datetime import timedelta
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
        rank, world = dist.get_rank(), dist.get_world_size()
        assert rank == int(os.environ["NODE_RANK"]) * 2 + int(os.environ["LOCAL_RANK"]), rank
        t = torch.tensor([float(rank)])
        dist.all_reduce(t)
        assert world == 4 and t.item() == 6.0, (world, t.item())
        dist.barrier()
        dist.destroy_process_group()
    """)
    port = str(free_port())
    procs = []
    for node in range(2):
        env = {**os.environ, "NODE_RANK": str(node), "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "GLOO_SOCKET_IFNAME": "lo",
               "OMP_NUM_THREADS": "1"}
        code = f"import sys; from rlscale.trainer.launcher import launch; sys.exit(launch({argv!r}))"
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    try:
        outs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs


def test_local_rank_0_alone_binds_the_pods_ports_and_is_ready_only_with_its_peers(monkeypatch):
    from types import SimpleNamespace

    from rlscale.trainer import entrypoint as E

    port = free_port()
    assert E.local_probe_port(port, 0) == port and E.local_probe_port(port, 1) == port + 100 + 1
    peer = E.start_probe_server(port, local_rank=1)  # on loopback, where local rank 0 asks
    try:
        assert peer.server_port == port + 101
        learner = SimpleNamespace(gang=SimpleNamespace(stopped=False))
        monkeypatch.setattr(E, "in_gang", lambda _learner: True)
        check = E.pod_ready_check(learner, port, local_rank=0, local_world=2)
        assert not check()  # the peer has not joined
        peer.ready_when(lambda: True)
        assert check()
    finally:
        peer.shutdown()


def test_who_starts_a_ray_node_and_what_it_offers(monkeypatch):
    from types import SimpleNamespace

    from rlscale.trainer import entrypoint as E

    monkeypatch.delenv(E.RAY_RESOURCES_ENV, raising=False)
    assert E.needs_ray_node(True, 0, 2) and not E.needs_ray_node(True, 2, 2) and not E.needs_ray_node(False, 0, 1)
    cfg = SimpleNamespace(ray_address="head:6379", object_store_bytes=2**28)
    assert not any(a.startswith("--resources") for a in E.ray_node_command(cfg))
    # Colocated: the first rank of every pod (or local learner process) offers the pod's rollout slot.
    monkeypatch.setenv(E.RAY_RESOURCES_ENV, '{"rollout": 1}')
    assert E.needs_ray_node(True, 2, 2) and E.needs_ray_node(False, 1, 1) and not E.needs_ray_node(True, 3, 2)
    assert '--resources={"rollout": 1}' in E.ray_node_command(cfg)


def test_each_rank_gets_the_pods_cores_over_its_ranks_unless_the_pod_sets_its_threads(tmp_path):
    from rlscale.trainer.launcher import cpu_budget, rank_threads

    assert rank_threads({}, 4, 2) == {"OMP_NUM_THREADS": "1"}  # never zero
    assert rank_threads({}, 2, 16) == {"OMP_NUM_THREADS": "8"}
    assert rank_threads({"OMP_NUM_THREADS": "3"}, 2, 16) == {}  # spec.learner.pod.env wins
    quota = tmp_path / "cpu.max"
    quota.write_text("150000 100000\n")  # a container limit of 1.5 CPUs
    assert cpu_budget(str(quota)) == 1
    quota.write_text("max 100000\n")
    assert cpu_budget(str(quota)) == len(os.sched_getaffinity(0))
    assert cpu_budget(str(tmp_path / "absent")) == len(os.sched_getaffinity(0))
