"""The learner pods of several ranks each, and a colocated run's children (operator/learner_pods.py)."""

from __future__ import annotations

import dataclasses
import json

from rlscale.operator import builders as B
from rlscale.operator import constants as C
from rlscale.operator import learner_pods as LP
from rlscale.plan import Plan
from rlscale.spec import parse_spec

RUN = B.RunRef(name="grpo-7b", namespace="team-a", uid="0000-1111")
PLAN = Plan.from_dict({"prompts": 32, "samplesPerPrompt": 8, "learningRate": 2e-5, "rolloutReplicas": 2,
                       "learnerReplicas": 2, "reason": "test",
                       "predicted": {"samplesPerSecond": 120.0, "stepSeconds": 2.1, "timeToTargetSeconds": 900.0,
                                     "samplesToTarget": 108_000.0,
                                     "phases": {"generate": 1.0, "reward": 0.01, "train": 1.0, "sync": 0.09}}})


def spec(**over):
    base = {"model": {"path": "builtin:tiny-arith"}, "hardware": {"accelerator": "H100"}, "budget": {"gpus": 16},
            "rollout": {"gpusPerReplica": 1}, "learner": {"gpusPerReplica": 2}}
    base.update(over)
    return parse_spec(base)


def colocated(plan: Plan = PLAN) -> Plan:
    return dataclasses.replace(plan, placement="colocated")


def container(sts):
    return sts["spec"]["template"]["spec"]["containers"][0]


def env_of(sts):
    return {e["name"]: e for e in container(sts)["env"]}


def by_kind(children):
    return {(m["kind"], m["metadata"]["name"]): m for m in children}


def test_two_ranks_a_pod_are_numbered_by_the_launcher_and_count_in_the_world_size():
    sts = B.build_learner_statefulset(RUN, spec(), PLAN, B.Images())
    env = env_of(sts)
    assert sts["spec"]["replicas"] == 2  # pods, one per node
    # The pod's launcher numbers its ranks: RANK = NODE_RANK x 2 + LOCAL_RANK.
    assert "RANK" not in env and "LOCAL_RANK" not in env
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.labels['{C.LABEL_POD_INDEX}']"
    assert env["LOCAL_WORLD_SIZE"]["value"] == "2"
    assert env["WORLD_SIZE"]["value"] == "4"
    assert env["MASTER_ADDR"]["value"] == "grpo-7b-learner-0.grpo-7b-learner.team-a.svc"
    res = container(sts)["resources"]
    assert res["requests"][C.GPU_RESOURCE] == res["limits"][C.GPU_RESOURCE] == "2"  # one GPU a rank
    assert container(sts)["command"] == ["rlscale", "learner", "--config", C.CONFIG_PATH]
    assert LP.RAY_RESOURCES_ENV not in env  # disaggregated: no rollout slot on the learners
    assert LP.learner_world_size(spec(), PLAN) == 4


def test_ranks_per_replica_on_cpu_and_nccl_settings_from_the_pod_env():
    s = parse_spec({"hardware": {"accelerator": "cpu"},
                    "learner": {"ranksPerReplica": 2, "pod": {"env": [{"name": "NCCL_DEBUG", "value": "INFO"}]}}})
    sts = B.build_learner_statefulset(RUN, s, PLAN, B.Images())
    env = env_of(sts)
    assert env["LOCAL_WORLD_SIZE"]["value"] == "2" and env["WORLD_SIZE"]["value"] == "4"
    assert env["NCCL_DEBUG"]["value"] == "INFO"
    assert C.GPU_RESOURCE not in json.dumps(container(sts)["resources"])
    # Default on cpu: one rank a pod.
    one = env_of(B.build_learner_statefulset(RUN, parse_spec({"hardware": {"accelerator": "cpu"}}), PLAN, B.Images()))
    assert one["LOCAL_WORLD_SIZE"]["value"] == "1" and "RANK" in one


def test_the_grace_period_is_the_pods_share_of_the_checkpoint():
    sts = B.build_learner_statefulset(RUN, spec(), PLAN, B.Images())
    grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == B.learner_grace_seconds(spec(), PLAN.learner_replicas)


def test_a_colocated_run_has_no_rollout_pods_and_its_learner_pods_offer_the_rollout_slot():
    plan = colocated()
    kids = by_kind(B.build_children(RUN, spec(), plan))
    assert ("Deployment", "grpo-7b-rollout") not in kids
    assert ("PodDisruptionBudget", "grpo-7b-rollout") not in kids
    sts = kids[("StatefulSet", "grpo-7b-learner")]
    env = env_of(sts)
    assert json.loads(env[LP.RAY_RESOURCES_ENV]["value"]) == {"rollout": 1}
    ports = {p["name"]: p["containerPort"] for p in container(sts)["ports"]}
    assert ports["rollout-metrics"] == LP.COLOCATED_ROLLOUT_METRICS_PORT != ports["metrics"]
    # The engine loads the model on the learner pod: the model volume is there, prepared first.
    assert sts["spec"]["template"]["spec"]["initContainers"][0]["name"] == "model"
    # Scraped and admitted like a rollout pod's metrics port.
    svc = kids[("Service", "grpo-7b-metrics")]
    assert {p["name"] for p in svc["spec"]["ports"]} == {"metrics", "rollout-metrics"}
    pol = next(m for m in kids.values() if m["kind"] == "NetworkPolicy")
    scraped = {p["port"] for r in pol["spec"]["ingress"] for p in r.get("ports", [])}
    assert scraped == {C.METRICS_PORT, LP.COLOCATED_ROLLOUT_METRICS_PORT}
    assert B.desired_replicas(spec(), plan) == {C.ROLE_RAY_HEAD: 1, C.ROLE_ROLLOUT: 0, C.ROLE_LEARNER: 2}


def test_a_colocated_run_gangs_and_queues_only_pods_that_exist():
    plan = colocated()
    s = spec(scheduling={"podGroup": True, "queueName": "team-a"})
    kids = B.build_children(RUN, s, plan)
    group = next(m for m in kids if m["kind"] == "PodGroup")
    assert group["spec"]["minMember"] == 1 + 2  # the head and the learner pods
    wl = B.build_workload(RUN, s, plan, kids)
    assert [p["name"] for p in wl["spec"]["podSets"]] == [C.ROLE_RAY_HEAD, C.ROLE_LEARNER]


def test_a_disaggregated_run_is_unchanged():
    kids = by_kind(B.build_children(RUN, spec(), PLAN))
    assert kids[("Deployment", "grpo-7b-rollout")]["spec"]["replicas"] == 2
    svc = kids[("Service", "grpo-7b-metrics")]
    assert [p["name"] for p in svc["spec"]["ports"]] == ["metrics"]
