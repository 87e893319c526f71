"""The environment of a run's `ray start`: replicas at normal priority unless the user says otherwise."""

from rlscale.roles import ray_node_env
from rlscale.rollout.entrypoint import worker_env


def test_ray_workers_are_not_niced_by_default():
    # Ray starts workers at niceness 15; a niced rollout replica stalls the whole loop on a busy machine.
    assert ray_node_env({"HOME": "/nonexistent"})["RAY_worker_niceness"] == "0"
    assert worker_env({"HOME": "/nonexistent"})["RAY_worker_niceness"] == "0"


def test_the_user_setting_wins():
    assert ray_node_env({"HOME": "/nonexistent", "RAY_worker_niceness": "10"})["RAY_worker_niceness"] == "10"
