"""The environment of a run's `ray start`: replicas at normal priority unless the user says otherwise."""

from rlscale.roles import PICK_PORTS, free_port, ray_head_env, ray_node_env


def test_ray_workers_are_not_niced_by_default():
    # Ray starts workers at niceness 15; a niced rollout replica stalls the whole loop on a busy machine.
    assert ray_node_env({"HOME": "/nonexistent"})["RAY_worker_niceness"] == "0"


def test_the_user_setting_wins():
    assert ray_node_env({"HOME": "/nonexistent", "RAY_worker_niceness": "10"})["RAY_worker_niceness"] == "10"


def test_the_heads_node_does_not_drain_on_a_stop_unless_told_to():
    # Its actors (Serve's controller) have nowhere to go: Ray's default drain only held an ended run 30 s.
    drain = "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"
    assert ray_head_env({"HOME": "/nonexistent"})[drain] == "0"
    assert ray_head_env({"HOME": "/nonexistent", drain: "20"})[drain] == "20"
    # The other nodes keep what their pod sets (a rollout pod drains its replica: operator/builders.py).
    assert drain not in ray_node_env({"HOME": "/nonexistent"})
    assert ray_head_env({"HOME": "/nonexistent"})["RAY_worker_niceness"] == "0"


def test_free_ports_come_from_a_range_nothing_assigns_by_itself():
    # Not the kernel's ephemeral range (Ray's processes get those while a run starts), nor Ray's worker ports.
    ports = {free_port() for _ in range(20)}
    assert all(PICK_PORTS[0] <= p < PICK_PORTS[1] for p in ports)
    assert PICK_PORTS[1] <= 32768 and PICK_PORTS[0] >= 20000
