"""A learner rank in a pod answers its readiness probe (GET /ready on the metrics port) with 503
until it has joined the training (torch.distributed initialised, its Learner built) and while it
is out of it again (the gang released at the run's end); the same server carries its /metrics."""

from __future__ import annotations

import signal

import pytest

from rlscale.roles import free_port
from rlscale.runconfig import RunConfig
from rlscale.spec import parse_spec
from tests.conftest import http_get

get = http_get


@pytest.fixture
def pod_config(tmp_path, monkeypatch):
    """A run config as the operator mounts it (no local options: a pod), and rank 1's environment."""
    port = free_port()
    cfg = RunConfig(run="r", namespace="ns", spec=parse_spec({"hardware": {"accelerator": "cpu"}}),
                    model_dir=str(tmp_path / "model"), metrics_port=port)
    path = cfg.save(tmp_path / "run.json")
    monkeypatch.setenv("RANK", "1")
    return path, port


def test_a_follower_rank_is_ready_from_joining_the_gang_until_it_is_released(pod_config, monkeypatch):
    import torch.distributed as dist

    from rlscale.trainer import entrypoint, learner, run_env
    from rlscale.trainer.gang import GangWatch

    path, port = pod_config
    seen: dict[str, tuple[int, str]] = {}
    servers = []
    start = entrypoint.start_probe_server

    def recording_start(p, *rest):  # (metrics port, local rank)
        servers.append(start(p, *rest))
        return servers[-1]

    class JoiningLearner:
        """Learner's start-up as the probe sees it: the process group forms inside the constructor."""

        def __init__(self, _config):
            seen["starting"] = get(port, "/ready")  # the server is up, the rank has not joined
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
            self.rank, self.world_size, self.steps = 1, 2, 3
            self.config = type("Config", (), {"zero_stage": 1})()
            self.gang = GangWatch(1, 2, "127.0.0.1", 0)

        def follow(self):
            seen["following"] = get(port, "/ready")
            seen["metrics"] = get(port, "/metrics")
            self.gang.stop()  # rank 0's "stop": the run has ended

    monkeypatch.setattr(entrypoint, "start_probe_server", recording_start)
    monkeypatch.setattr(entrypoint, "learner_config_from_run", lambda cfg: None)
    monkeypatch.setattr(learner, "Learner", JoiningLearner)
    monkeypatch.setattr(run_env, "wait_for_termination", lambda: seen.setdefault("released", get(port, "/ready")))
    term = signal.getsignal(signal.SIGTERM)
    try:
        assert entrypoint._main(str(path)) == 0
    finally:
        signal.signal(signal.SIGTERM, term)
        if dist.is_initialized():
            dist.destroy_process_group()
        for s in servers:
            s.shutdown()
    assert seen["starting"][0] == 503
    assert seen["following"] == (200, "ready\n")
    code, text = seen["metrics"]
    assert code == 200 and 'rlscale_learner_rank_steps{rank="1"} 3.0' in text
    assert seen["released"][0] == 503


def test_in_gang_needs_the_process_group_and_an_unreleased_gang():
    import torch.distributed as dist

    from rlscale.trainer.entrypoint import in_gang
    from rlscale.trainer.gang import GangWatch

    rank = type("Rank", (), {})()
    rank.gang = GangWatch(0, 1, "127.0.0.1", 0)
    assert not dist.is_initialized() and not in_gang(rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        assert in_gang(rank)
        rank.gang.stop()
        assert not in_gang(rank)
    finally:
        dist.destroy_process_group()
    rank.gang = GangWatch(0, 1, "127.0.0.1", 0)
    assert not in_gang(rank)  # the group torn down: out of the training
