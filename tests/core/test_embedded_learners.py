"""What `rlscale run` starts for the learners: a process a rank, or a launcher a replica of several
ranks (trainer/launcher.py), numbered as the operator numbers pods; colocated, no rollout processes
and every learner process's Ray node offers a rollout slot."""

from __future__ import annotations

import dataclasses

from rlscale.learner_launch import RAY_RESOURCES_ENV, colocated, learner_launches
from rlscale.plan import make_plan
from rlscale.spec import parse_spec


def test_one_rank_a_replica_is_one_process_a_rank():
    envs = learner_launches(2, 1, "29999")
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) for e in envs] == \
        [("0", "0", "2", "1"), ("1", "1", "2", "1")]
    assert all(e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] == "29999" for e in envs)
    assert not any(RAY_RESOURCES_ENV in e for e in envs)


def test_several_ranks_a_replica_start_one_launcher_each_with_its_own_gpus():
    envs = learner_launches(2, 2, "29999", gpus=["0", "1", "2", "3"])
    got = [(e["NODE_RANK"], e["LOCAL_WORLD_SIZE"], e["WORLD_SIZE"]) for e in envs]
    assert got == [("0", "2", "4"), ("1", "2", "4")]
    assert not any("RANK" in e or "LOCAL_RANK" in e for e in envs)  # the launcher numbers its ranks
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "2,3"]
    assert "CUDA_VISIBLE_DEVICES" not in learner_launches(2, 2, "1")[0]  # cpu


def test_colocated_learners_offer_the_rollout_slots():
    envs = learner_launches(2, 2, "29999", colocate=True)
    assert [e[RAY_RESOURCES_ENV] for e in envs] == ['{"rollout": 1}'] * 2
    plan = make_plan(parse_spec({"hardware": {"accelerator": "cpu"}}))
    assert not colocated(plan) and colocated(dataclasses.replace(plan, placement="colocated"))
