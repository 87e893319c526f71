"""Unit tests of the pure builders: (spec, plan) -> manifests, no cluster."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rlscale.operator import builders as B
from rlscale.operator import constants as C
from rlscale.operator import settings as OS
from rlscale.plan import Plan
from rlscale.runconfig import RUNCONFIG_KIND
from rlscale.spec import parse_spec

RUN = B.RunRef(name="grpo-7b", namespace="team-a", uid="0000-1111")
PLAN = Plan.from_dict({"prompts": 32, "samplesPerPrompt": 8, "learningRate": 2e-5, "rolloutReplicas": 3,
        "learnerReplicas": 2, "predicted": {"samplesPerSecond": 120.0, "stepSeconds": 2.1, "timeToTargetSeconds": 900.0,
                                            "samplesToTarget": 108_000.0,
                                            "phases": {"generate": 1.0, "reward": 0.01, "train": 1.0, "sync": 0.09}},
        "reason": "N=256 wins"})


def spec(**over):
    base = {"model": {"path": "builtin:tiny-arith"}, "hardware": {"accelerator": "H100"}, "budget": {"gpus": 16},
            "rollout": {"gpusPerReplica": 1}, "learner": {"gpusPerReplica": 2}}
    base.update(over)
    return parse_spec(base)


def by_kind(children):
    return {(m["kind"], m["metadata"]["name"]): m for m in children}


def test_every_child_is_owned_labelled_and_named_once():
    kids = B.build_children(RUN, spec(), PLAN)
    assert len(by_kind(kids)) == len(kids) == 14
    for m in kids:
        md = m["metadata"]
        assert md["namespace"] == "team-a"
        assert md["labels"][C.LABEL_RUN] == "grpo-7b"
        assert md["labels"][C.LABEL_ROLE] in {C.ROLE_CONFIG, C.ROLE_RAY_HEAD, C.ROLE_ROLLOUT, C.ROLE_LEARNER,
                                              C.ROLE_METRICS, C.ROLE_RUNNER, C.ROLE_NETWORK}
        (ref,) = md["ownerReferences"]
        assert ref == {"apiVersion": "rlscale.dev/v1alpha1", "kind": "RLRun", "name": "grpo-7b",
                       "uid": "0000-1111", "controller": True, "blockOwnerDeletion": True}
    assert kids[0]["kind"] == "ConfigMap"  # pods mount it: it goes first


def test_replicas_come_from_the_plan_and_suspend_zeroes_both():
    kids = by_kind(B.build_children(RUN, spec(), PLAN))
    assert kids[("Deployment", "grpo-7b-rollout")]["spec"]["replicas"] == 3
    assert kids[("StatefulSet", "grpo-7b-learner")]["spec"]["replicas"] == 2
    kids = by_kind(B.build_children(RUN, spec(suspend=True), PLAN))
    assert kids[("Deployment", "grpo-7b-rollout")]["spec"]["replicas"] == 0
    assert kids[("StatefulSet", "grpo-7b-learner")]["spec"]["replicas"] == 0
    assert ("ConfigMap", "grpo-7b-config") in kids  # config kept while suspended
    assert kids[("Deployment", "grpo-7b-ray-head")]["spec"]["replicas"] == 1  # the head stays up


def test_stopping_learners_keep_their_rollout_replicas_until_they_are_gone():
    """Suspend (or a Kueue eviction) stops the learners first: while a learner pod is still
    there (`draining`), the replicas serving its last step stay; then they go too."""
    replicas = {(m["kind"], m["metadata"]["name"]): m["spec"]["replicas"]
                for m in B.build_children(RUN, spec(suspend=True), PLAN, draining=3)
                if m["kind"] in ("Deployment", "StatefulSet")}
    assert replicas == {("Deployment", "grpo-7b-ray-head"): 1, ("Deployment", "grpo-7b-rollout"): 3,
                        ("StatefulSet", "grpo-7b-learner"): 0}
    evicted = B.desired_replicas(spec(), PLAN, admitted=dict.fromkeys(B.QUEUED_ROLES, 0), draining=3)
    assert evicted == {C.ROLE_RAY_HEAD: 1, C.ROLE_ROLLOUT: 3, C.ROLE_LEARNER: 0}
    # Learners wanted: at least the plan's, or the replicas the driver has not drained yet (ordered
    # scaling keeps 5 while the plan says 3); the run over: no replica kept, only the head while its rollout pods
    # stop (tests/operator/test_end_order.py).
    assert B.desired_replicas(spec(), PLAN, draining=1)[C.ROLE_ROLLOUT] == 3
    assert B.desired_replicas(spec(), PLAN, draining=5) == {C.ROLE_RAY_HEAD: 1, C.ROLE_ROLLOUT: 5, C.ROLE_LEARNER: 2}
    assert B.desired_replicas(spec(suspend=True), PLAN, finished=True, draining=3) == {
        C.ROLE_RAY_HEAD: 1, C.ROLE_ROLLOUT: 0, C.ROLE_LEARNER: 0}


def test_a_rollout_pod_drains_its_replica_on_a_stop_within_its_grace_period():
    """The pod's `ray start --block` marks its node draining on SIGTERM: Serve moves the replica off
    it and stops it gracefully (its in-flight requests finish within Serve's graceful shutdown), and
    the kubelet waits for all of that; no preStop hook."""
    dep = by_kind(B.build_children(RUN, spec(), PLAN))[("Deployment", "grpo-7b-rollout")]
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    drain = int(env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"])
    assert drain >= C.ROLLOUT_GRACEFUL_SHUTDOWN_S + 30  # Serve stops the replica a graceful shutdown early
    assert pod["terminationGracePeriodSeconds"] >= drain + 30
    assert "lifecycle" not in container


def test_a_finished_run_scales_everything_to_zero_and_keeps_its_config():
    kids = by_kind(B.build_children(RUN, spec(), PLAN, finished=True))
    for kind, name in (("Deployment", "grpo-7b-rollout"), ("StatefulSet", "grpo-7b-learner"),
                       ("Deployment", "grpo-7b-ray-head")):
        assert kids[(kind, name)]["spec"]["replicas"] == 0, name
    assert ("ConfigMap", "grpo-7b-config") in kids and ("Service", "grpo-7b-metrics") in kids


def test_model_volume_is_shared_and_prepared_by_the_learners():
    vol = {"persistentVolumeClaim": {"claimName": "models"}}
    kids = by_kind(B.build_children(RUN, spec(model={"path": "builtin:tiny-arith", "volume": vol}), PLAN))
    learner = kids[("StatefulSet", "grpo-7b-learner")]["spec"]["template"]["spec"]
    rollout = kids[("Deployment", "grpo-7b-rollout")]["spec"]["template"]["spec"]
    for pod in (learner, rollout):
        assert {"name": "model", **vol} in pod["volumes"]
    (init,) = learner["initContainers"]
    assert init["command"] == ["rlscale", "prepare-model", "--config", C.CONFIG_PATH]
    assert {"name": "model", "mountPath": C.MODEL_MOUNT, "readOnly": False} in init["volumeMounts"]
    # Replicas read what the learners prepared: read-only, no init of their own.
    assert "initContainers" not in rollout
    (mount,) = [m for m in rollout["containers"][0]["volumeMounts"] if m["name"] == "model"]
    assert mount == {"name": "model", "mountPath": C.MODEL_MOUNT, "readOnly": True}
    # Without a named volume each pod prepares its own copy in an emptyDir.
    kids = by_kind(B.build_children(RUN, spec(), PLAN))
    rollout = kids[("Deployment", "grpo-7b-rollout")]["spec"]["template"]["spec"]
    assert {"name": "model", "emptyDir": {}} in rollout["volumes"] and rollout["initContainers"]
    env = {e["name"]: e.get("value") for e in rollout["containers"][0]["env"]}
    assert env["HF_HOME"] == C.HF_HOME and env["HF_HUB_OFFLINE"] == "1"


def test_plugin_volume_reaches_the_learners_read_only_and_is_named_to_the_reward_loader():
    vol = {"configMap": {"name": "my-reward"}}
    kids = by_kind(B.build_children(RUN, spec(task={"reward": "0.5*my_reward:score + 0.5*format",
                                                    "pluginVolume": vol}), PLAN))
    learner = kids[("StatefulSet", "grpo-7b-learner")]["spec"]["template"]["spec"]
    assert {"name": "plugins", **vol} in learner["volumes"]
    (box,) = learner["containers"]
    assert {"name": "plugins", "mountPath": C.PLUGINS_MOUNT, "readOnly": True} in box["volumeMounts"]
    assert {"name": C.PLUGINS_ENV, "value": C.PLUGINS_MOUNT} in box["env"]
    # Only rank 0's driver scores samples: the replicas and the head never see the files.
    for kind, name in (("Deployment", "grpo-7b-rollout"), ("Deployment", "grpo-7b-ray-head")):
        pod = kids[(kind, name)]["spec"]["template"]["spec"]
        assert all(v["name"] != "plugins" for v in pod["volumes"]), name
    # Without the field, no such volume.
    learner = by_kind(B.build_children(RUN, spec(), PLAN))[("StatefulSet", "grpo-7b-learner")]
    assert all(v["name"] != "plugins" for v in learner["spec"]["template"]["spec"]["volumes"])


def test_every_pod_has_a_memory_backed_shm_sized_for_the_object_store_not_for_the_model():
    kids = B.build_children(RUN, spec(model={"path": "Qwen/Qwen2.5-7B", "dtype": "bfloat16"}), PLAN)
    cfg = json.loads(kids[0]["data"][C.CONFIG_KEY])
    # 7.6B bf16 weights are ~15 GB, and none passes through the object store any more (vLLM's weight transfer
    # engines move them): a pod's memory-backed /dev/shm must not ask for copies of the model.
    assert 256 * 2**20 <= cfg["object_store_bytes"] < 15e9 / 4
    for m in kids:
        pod = m.get("spec", {}).get("template", {}).get("spec")
        if pod:
            (shm,) = [v for v in pod["volumes"] if v["name"] == "shm"]
            assert shm["emptyDir"]["medium"] == "Memory"
            size_mi = int(shm["emptyDir"]["sizeLimit"].removesuffix("Mi"))
            assert size_mi * 2**20 > cfg["object_store_bytes"]
            assert {"name": "shm", "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]


def test_checkpoint_volume_named_by_the_spec_is_shared_by_every_rank_and_holds_the_report():
    vol = {"persistentVolumeClaim": {"claimName": "ckpt"}}
    s = spec(checkpoint={"path": "/ckpt", "volume": vol})
    sts = B.build_learner_statefulset(RUN, s, PLAN, B.Images(checkpoint_storage="50Gi"))
    assert "volumeClaimTemplates" not in sts["spec"]
    assert {"name": "checkpoints", **vol} in sts["spec"]["template"]["spec"]["volumes"]
    cfg = json.loads(B.build_configmap(RUN, s, PLAN)["data"][C.CONFIG_KEY])
    assert cfg["checkpoint_dir"] == "/ckpt" and cfg["report_dir"] == "/ckpt/report"
    assert cfg["model_cache"] == C.MODEL_MOUNT


def test_gpu_requests_follow_gpus_per_replica_and_cpu_has_none():
    kids = by_kind(B.build_children(RUN, spec(), PLAN))
    roll = kids[("Deployment", "grpo-7b-rollout")]["spec"]["template"]["spec"]["containers"][0]
    learn = kids[("StatefulSet", "grpo-7b-learner")]["spec"]["template"]["spec"]["containers"][0]
    assert roll["resources"]["limits"][C.GPU_RESOURCE] == "1"
    assert learn["resources"]["limits"][C.GPU_RESOURCE] == "2"
    assert learn["resources"]["requests"][C.GPU_RESOURCE] == "2"
    cpu = by_kind(B.build_children(RUN, parse_spec({"hardware": {"accelerator": "cpu"}}), PLAN))
    c = cpu[("Deployment", "grpo-7b-rollout")]["spec"]["template"]["spec"]["containers"][0]
    assert C.GPU_RESOURCE not in json.dumps(c["resources"])


def test_user_resources_are_kept_and_not_mutated():
    s = spec(rollout={"gpusPerReplica": 1, "resources": {"limits": {"memory": "64Gi"}}})
    kids = by_kind(B.build_children(RUN, s, PLAN))
    res = kids[("Deployment", "grpo-7b-rollout")]["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert res["limits"] == {"memory": "64Gi", C.GPU_RESOURCE: "1"}
    assert s.rollout.resources == {"limits": {"memory": "64Gi"}}


def test_learner_ranks_get_rank_world_size_and_master():
    # One GPU a pod: one rank a pod, the pod's index its RANK (several: tests/operator/test_learner_pods.py).
    sts = B.build_learner_statefulset(RUN, spec(learner={"gpusPerReplica": 1}), PLAN, B.Images())
    env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.labels['{C.LABEL_POD_INDEX}']"
    assert env["WORLD_SIZE"]["value"] == "2" and env["LOCAL_WORLD_SIZE"]["value"] == "1"
    assert env["MASTER_ADDR"]["value"] == "grpo-7b-learner-0.grpo-7b-learner.team-a.svc"
    assert env["RLSCALE_CONFIG"]["value"] == C.CONFIG_PATH
    assert sts["spec"]["serviceName"] == "grpo-7b-learner"
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    svc = B.build_learner_service(RUN)
    assert svc["spec"]["clusterIP"] == "None" and svc["metadata"]["name"] == sts["spec"]["serviceName"]


def test_role_entrypoints_read_the_mounted_config():
    kids = B.build_children(RUN, spec(), PLAN)
    cmds = {}
    for m in kids:
        pod = m.get("spec", {}).get("template", {}).get("spec")
        if pod:
            c = pod["containers"][0]
            cmds[m["metadata"]["labels"][C.LABEL_ROLE]] = c["command"]
            assert {"name": "run-config", "configMap": {"name": "grpo-7b-config"}} in pod["volumes"]
            assert any(v["mountPath"] == C.CONFIG_MOUNT_DIR for v in c["volumeMounts"])
    assert cmds == {r: ["rlscale", r, "--config", C.CONFIG_PATH]
                    for r in (C.ROLE_RAY_HEAD, C.ROLE_ROLLOUT, C.ROLE_LEARNER)}


def test_configmap_holds_the_resolved_run_config():
    cm = B.build_configmap(RUN, spec(), PLAN)
    cfg = json.loads(cm["data"][C.CONFIG_KEY])
    assert cfg["kind"] == RUNCONFIG_KIND and cfg["run"] == "grpo-7b" and cfg["namespace"] == "team-a"
    assert Plan.from_dict(cfg["plan"]) == PLAN  # the plan, whole, as the roles read it back
    # Without its candidates, as status.plan keeps it: a fresh plan and the same plan read back from
    # status write the same ConfigMap.
    with_candidates = dataclasses.replace(PLAN, candidates=[c for c in _fresh_plan().candidates])
    assert with_candidates.candidates and B.build_configmap(RUN, spec(), with_candidates) == cm
    assert cfg["spec"]["learner"]["gpusPerReplica"] == 2  # camelCase, as in the RLRun
    assert cfg["ray_address"] == "grpo-7b-ray-head.team-a.svc:6379"


def test_builders_are_pure_and_deterministic():
    s = spec()
    a = json.dumps(B.build_children(RUN, s, PLAN), sort_keys=True)
    b = json.dumps(B.build_children(RUN, s, Plan.from_dict(PLAN.to_dict())), sort_keys=True)
    assert a == b
    changed = dataclasses.replace(PLAN, rollout_replicas=4)
    assert B.plan_hash(changed) != B.plan_hash(PLAN)


@pytest.mark.parametrize("run", ["a", "x" * 40, "y" * 63])
def test_child_names_fit_dns_labels_and_stay_unique(run):
    n = B.names(run)
    assert len(set(n.values())) == len(n)
    for name in n.values():
        assert len(name) <= 52 and name[0].isalnum() and name[-1].isalnum()
    assert B.names(run) == n  # stable


def test_checkpoint_storage_uses_claims_that_survive_scale_to_zero_and_the_runs_deletion():
    sts = B.build_learner_statefulset(RUN, spec(), PLAN, B.Images(checkpoint_storage="50Gi"))
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "50Gi"
    # Retained on delete by default: no owner reference, so the garbage collector leaves them.
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenScaled": "Retain", "whenDeleted": "Retain"}
    gone = B.build_learner_statefulset(RUN, spec(checkpoint={"claimRetention": "Delete"}), PLAN,
                                       B.Images(checkpoint_storage="50Gi"))
    assert gone["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete"
    plain = B.build_learner_statefulset(RUN, spec(), PLAN, B.Images())
    assert "volumeClaimTemplates" not in plain["spec"]
    assert {"name": "checkpoints", "emptyDir": {}} in plain["spec"]["template"]["spec"]["volumes"]


def test_images_default_from_the_environment_and_spec_wins():
    imgs = OS.OperatorSettings.from_env({OS.ENV_TRAINER_IMAGE: "reg/t:1", OS.ENV_ROLLOUT_IMAGE: "reg/r:1"}).children
    kids = by_kind(B.build_children(RUN, spec(rollout={"gpusPerReplica": 1, "image": "mine/vllm:2"}), PLAN, imgs))
    assert (kids[("Deployment", "grpo-7b-rollout")]["spec"]["template"]["spec"]["containers"][0]["image"]
            == "mine/vllm:2")
    assert kids[("StatefulSet", "grpo-7b-learner")]["spec"]["template"]["spec"]["containers"][0]["image"] == "reg/t:1"


def test_runner_account_may_patch_only_its_own_run():
    sa, role, binding = B.build_runner_account(RUN)
    assert sa["kind"] == "ServiceAccount" and sa["metadata"]["name"] == "grpo-7b-runner"
    (rule,) = role["rules"]
    assert rule == {"apiGroups": ["rlscale.dev"], "resources": ["rlruns"], "resourceNames": ["grpo-7b"],
                    "verbs": ["get", "patch"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "grpo-7b-runner", "namespace": "team-a"}]
    head = B.build_ray_head(RUN, spec(), B.Images())
    assert head["spec"]["template"]["spec"]["serviceAccountName"] == "grpo-7b-runner"


def pods(kids):
    """(role, pod spec, template metadata) of every workload."""
    return [(m["metadata"]["labels"][C.LABEL_ROLE], m["spec"]["template"]["spec"], m["spec"]["template"]["metadata"])
            for m in kids if m["kind"] in ("Deployment", "StatefulSet")]


def test_every_pod_meets_the_restricted_pod_security_profile():
    for role, pod, _ in pods(B.build_children(RUN, spec(), PLAN)):
        sc = pod["securityContext"]
        assert (sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
                and sc["seccompProfile"] == {"type": "RuntimeDefault"})
        for c in pod["containers"] + pod.get("initContainers", []):
            cs = c["securityContext"]
            assert (cs["allowPrivilegeEscalation"] is False
                    and cs["capabilities"] == {"drop": ["ALL"]}), (role, c["name"])
            assert cs["readOnlyRootFilesystem"] is True
            # A read-only root needs somewhere to write: HOME and /tmp are emptyDirs.
            paths = {m["mountPath"] for m in c["volumeMounts"]}
            assert {C.HOME_MOUNT, "/tmp"} <= paths, (role, c["name"], paths)
            assert {"name": "HOME", "value": C.HOME_MOUNT} in c["env"]
            assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert not any("hostPath" in v or "hostNetwork" in v for v in pod["volumes"])


def test_only_the_learner_mounts_an_api_token():
    got = {role: pod["automountServiceAccountToken"] for role, pod, _ in pods(B.build_children(RUN, spec(), PLAN))}
    assert got == {C.ROLE_RAY_HEAD: False, C.ROLE_ROLLOUT: False, C.ROLE_LEARNER: True}


def test_every_pod_reads_the_runs_ray_token_from_its_secret():
    secret = B.build_ray_token_secret(RUN, B.new_ray_token())
    assert secret["metadata"]["ownerReferences"][0]["uid"] == RUN.uid
    assert len(secret["stringData"][C.TOKEN_KEY]) >= 32
    assert B.new_ray_token() != B.new_ray_token()
    for role, pod, _ in pods(B.build_children(RUN, spec(), PLAN)):
        for c in pod["containers"] + pod.get("initContainers", []):
            env = {e["name"]: e for e in c["env"]}
            assert env["RAY_AUTH_MODE"]["value"] == "token", role
            assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
                "name": secret["metadata"]["name"], "key": C.TOKEN_KEY}, role


def test_network_policy_admits_the_runs_own_pods_and_metrics_from_monitoring_only():
    kids = B.build_children(RUN, spec(), PLAN, B.Images(metrics_from=("monitoring", "obs")))
    (np,) = [m for m in kids if m["kind"] == "NetworkPolicy"]
    assert np["spec"]["podSelector"] == {"matchLabels": {C.LABEL_RUN: "grpo-7b"}}
    own, metrics = np["spec"]["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": {C.LABEL_RUN: "grpo-7b"}}}]}
    assert metrics["ports"] == [{"port": C.METRICS_PORT, "protocol": "TCP"}]
    (sel,) = metrics["from"]
    assert sel["namespaceSelector"]["matchExpressions"][0]["values"] == ["monitoring", "obs"]
    assert not [m for m in B.build_children(RUN, spec(), PLAN, B.Images(network_policy=False))
                if m["kind"] == "NetworkPolicy"]
    env = OS.OperatorSettings.from_env({OS.ENV_NETWORK_POLICY: "false", OS.ENV_METRICS_FROM: "prom, grafana"}).children
    assert env.network_policy is False and env.metrics_from == ("prom", "grafana")


def _egress(images, **over):
    (np,) = [m for m in B.build_children(RUN, spec(**over), PLAN, images) if m["kind"] == "NetworkPolicy"]
    return np["spec"]


def test_egress_is_the_runs_own_needs_unless_the_admin_opens_it():
    from rlscale.operator.egress import endpoints

    slice_ = {"endpoints": [{"addresses": ["10.0.0.5"]}, {"addresses": ["fd00::5"]}],
              "ports": [{"name": "https", "port": 6443}]}
    api = endpoints(slice_)
    assert api == (("10.0.0.5", 6443), ("fd00::5", 6443)) and endpoints(None) == ()
    sp = _egress(B.Images(api_server=api, egress_cidrs=("192.0.2.0/24",)))
    assert sp["policyTypes"] == ["Ingress", "Egress"]
    own, dns, *api_rules, extra = sp["egress"]
    assert own == {"to": [{"podSelector": {"matchLabels": {C.LABEL_RUN: "grpo-7b"}}}]}
    assert dns == {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    assert api_rules == [{"to": [{"ipBlock": {"cidr": "10.0.0.5/32"}}], "ports": [{"port": 6443, "protocol": "TCP"}]},
                         {"to": [{"ipBlock": {"cidr": "fd00::5/128"}}], "ports": [{"port": 6443, "protocol": "TCP"}]}]
    assert extra == {"to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}]}
    # Nothing else reaches out: no rule without a destination but DNS's port 53.
    assert all("to" in r or r == dns for r in sp["egress"])
    # The API server's endpoints unknown: its usual ports anywhere; a model download: HTTPS anywhere.
    unknown = _egress(B.Images())["egress"]
    assert {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]} in unknown
    download = _egress(B.Images(api_server=api), model={"path": "builtin:tiny-arith", "download": True})["egress"]
    assert {"ports": [{"port": 443, "protocol": "TCP"}]} in download
    opened = _egress(B.Images(egress="open"))
    assert opened["policyTypes"] == ["Ingress"] and "egress" not in opened
    env = OS.OperatorSettings.from_env({OS.ENV_EGRESS: "open", OS.ENV_EGRESS_CIDRS: "192.0.2.0/24"}).children
    assert (env.egress, env.egress_cidrs) == ("open", ("192.0.2.0/24",))
    assert OS.OperatorSettings.from_env({}).children.egress == "restricted"


def test_pod_overrides_reach_their_role_and_cannot_displace_the_operators_own():
    s = spec(
        scheduling={"queueName": "team-a-gpus", "schedulerName": "volcano", "priorityClassName": "batch"},
        learner={"gpusPerReplica": 2, "pod": {
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "nodeSelector": {"pool": "h100"}, "priorityClassName": "train-high",
            "imagePullSecrets": ["regcred"], "labels": {"team": "a"},
            "annotations": {"note": "x"}, "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}]}},
        rollout={"gpusPerReplica": 1, "pod": {"runtimeClassName": "nvidia"}})
    # `validate` refuses a label under rlscale.dev; should one get past it, the operator's own still wins.
    s.learner.pod.labels[C.LABEL_RUN] = "someone-else"
    kids = B.build_children(RUN, s, PLAN)
    got = {role: (pod, meta) for role, pod, meta in pods(kids)}
    pod, meta = got[C.ROLE_LEARNER]
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu" and pod["nodeSelector"] == {"pool": "h100"}
    assert pod["priorityClassName"] == "train-high" and pod["schedulerName"] == "volcano"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert meta["labels"]["team"] == "a" and meta["labels"][C.LABEL_RUN] == "grpo-7b"  # ours win
    assert meta["annotations"] == {"note": "x"}
    (c,) = pod["containers"]
    assert {"name": "NCCL_DEBUG", "value": "INFO"} in c["env"]
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in c["volumeMounts"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "data"}} in pod["volumes"]
    pod, meta = got[C.ROLE_ROLLOUT]
    assert pod["runtimeClassName"] == "nvidia" and pod["priorityClassName"] == "batch"
    assert "tolerations" not in pod and "team" not in meta["labels"]
    pod, meta = got[C.ROLE_RAY_HEAD]  # the head: scheduling, and the learner's image access and placement
    assert pod["schedulerName"] == "volcano" and pod["priorityClassName"] == "batch"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}] and pod["nodeSelector"] == {"pool": "h100"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    (c,) = pod["containers"]
    assert "team" not in meta["labels"] and not any(e["name"] == "NCCL_DEBUG" for e in c["env"])
    assert not any(v["name"] == "data" for v in pod["volumes"]) and "runtimeClassName" not in pod
    # No Kueue label on any workload or pod: the queue admits the run as one Workload, and the
    # label would make Kueue's Deployment and StatefulSet integrations admit each on its own.
    for m in kids:
        assert C.LABEL_KUEUE_QUEUE not in m["metadata"]["labels"], m["kind"]
        assert C.LABEL_KUEUE_QUEUE not in ((m.get("spec") or {}).get("template") or {}).get("metadata", {}).get(
            "labels", {}), m["kind"]


def test_a_queued_run_is_one_kueue_workload_and_runs_only_what_kueue_admitted():
    s = spec(scheduling={"queueName": "team-a-gpus"})
    kids = B.build_children(RUN, s, PLAN)
    wl = B.build_workload(RUN, s, PLAN, kids)
    assert wl["apiVersion"] == C.KUEUE_API and wl["kind"] == "Workload"
    assert wl["metadata"]["ownerReferences"][0]["uid"] == RUN.uid and wl["spec"]["queueName"] == "team-a-gpus"
    assert wl["spec"]["active"] is True
    sets = {p["name"]: p for p in wl["spec"]["podSets"]}
    assert {r: p["count"] for r, p in sets.items()} == {C.ROLE_RAY_HEAD: 1, C.ROLE_ROLLOUT: 3, C.ROLE_LEARNER: 2}
    # The pod sets carry the pods' own templates: Kueue counts their GPU requests.
    sts = next(m for m in kids if m["kind"] == "StatefulSet")
    assert sets[C.ROLE_LEARNER]["template"] == sts["spec"]["template"]
    limits = sets[C.ROLE_LEARNER]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits[C.GPU_RESOURCE] == "2"
    # Suspended: the Workload goes inactive (Kueue gives the quota back), its counts stay planned.
    wl_s = B.build_workload(RUN, spec(scheduling={"queueName": "q"}, suspend=True), PLAN, kids)
    assert wl_s["spec"]["active"] is False and wl_s["spec"]["podSets"][1]["count"] == 3

    def replicas(admitted):
        got = by_kind(B.build_children(RUN, s, PLAN, admitted=admitted))
        return (got[("Deployment", "grpo-7b-ray-head")]["spec"]["replicas"],
                got[("Deployment", "grpo-7b-rollout")]["spec"]["replicas"],
                got[("StatefulSet", "grpo-7b-learner")]["spec"]["replicas"])
    # Not admitted: nothing runs, not even the head; admitted: the planned counts, capped by
    # what Kueue admitted.
    assert replicas(B.admitted_counts(None)) == (0, 0, 0)
    assert replicas(B.admitted_counts(_admitted_workload({"ray-head": 1, "rollout": 3, "learner": 2}))) == (1, 3, 2)
    assert replicas(B.admitted_counts(_admitted_workload({"ray-head": 1, "rollout": 2, "learner": 2}))) == (1, 2, 2)
    evicted = _admitted_workload({"ray-head": 1, "rollout": 3, "learner": 2})
    evicted["status"]["conditions"].append({"type": "Evicted", "status": "True", "reason": "Preempted"})
    assert replicas(B.admitted_counts(evicted)) == (0, 0, 0)
    assert replicas(None) == (1, 3, 2)  # no queue: the plan's


def test_a_pod_group_gangs_every_pod_of_the_run_and_comes_before_them():
    kids = B.build_children(RUN, spec(scheduling={"podGroup": True, "schedulerName": "scheduler-plugins"}), PLAN)
    kinds = [m["kind"] for m in kids]
    pg = kids[kinds.index("PodGroup")]
    assert kinds.index("PodGroup") < min(i for i, k in enumerate(kinds) if k in ("Deployment", "StatefulSet"))
    assert pg["apiVersion"] == C.POD_GROUP_API and pg["spec"]["minMember"] == 1 + 3 + 2  # head, rollout, learners
    for role, pod, meta in pods(kids):
        assert meta["labels"][C.LABEL_POD_GROUP] == pg["metadata"]["name"], role
        assert pod["schedulerName"] == "scheduler-plugins", role
    assert "PodGroup" not in [m["kind"] for m in B.build_children(RUN, spec(), PLAN)]


def _admitted_workload(counts: dict[str, int]) -> dict:
    return {"status": {"admission": {"clusterQueue": "cq", "podSetAssignments": [
        {"name": r, "count": n} for r, n in counts.items()]},
        "conditions": [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}]}}


def test_learner_grace_period_grows_with_the_checkpoint_a_rank_writes():
    small = B.learner_grace_seconds(parse_spec({"hardware": {"accelerator": "cpu"}}), 1)
    big = B.learner_grace_seconds(spec(model={"path": "Qwen/Qwen2.5-7B"}), 2)
    assert small == 90  # the builtin model's checkpoint is a few MB
    # 7.6B parameters x 14 bytes over 2 ranks at 100 MB/s, twice, plus a minute: ~18 minutes.
    assert 900 < big < 1300, big
    sts = next(m for m in B.build_children(RUN, spec(model={"path": "Qwen/Qwen2.5-7B"}), PLAN)
               if m["kind"] == "StatefulSet")
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == big


def _fresh_plan() -> Plan:
    from rlscale.plan import make_plan

    return make_plan(spec())


def test_the_specs_token_suffix_is_the_operators_token_secret_name():
    """The spec refuses Secrets named *RAY_TOKEN_SECRET_SUFFIX: that must be every run's token Secret,
    a long name shortened with a hash included."""
    from rlscale.spec import RAY_TOKEN_SECRET_SUFFIX

    for run in ("r", "a" * 63):
        assert B.names(run)[C.ROLE_TOKEN].endswith(RAY_TOKEN_SECRET_SUFFIX)


def test_run_images_prefer_the_record_and_the_record_holds_only_the_defaults_taken():
    now = B.Images(trainer="reg/t:2", rollout="reg/r:2", checkpoint_storage="10Gi")
    assert B.run_images(now, None) == now and B.run_images(now, {}) == now
    kept = B.run_images(now, {"trainer": "reg/t:1", "rollout": "reg/r:1"})
    assert (kept.trainer, kept.rollout, kept.checkpoint_storage) == ("reg/t:1", "reg/r:1", "10Gi")
    assert B.run_images(now, {"rollout": "reg/r:1"}).trainer == "reg/t:2"
    assert B.images_record(spec(), kept) == {"trainer": "reg/t:1", "rollout": "reg/r:1"}
    assert B.images_record(spec(learner={"image": "mine/t:7"}), kept) == {"rollout": "reg/r:1"}
    assert B.images_record(spec(learner={"image": "a"}, rollout={"image": "b"}), kept) == {}


def test_every_role_is_ready_only_when_its_work_can_start():
    """Readiness probes, no liveness or startup probes (a slow start waits, it never restarts):
    the head's GCS answers gRPC health checks on its port; rollout and learner pods answer
    /ready on their metrics port, the path rlscale.rollout.readiness serves. CPU and GPU runs
    get the same probes."""
    from rlscale.rollout.readiness import READY_PATH

    assert C.READY_PATH == READY_PATH
    for s in (spec(), parse_spec({"hardware": {"accelerator": "cpu"}})):
        got = {role: pod["containers"][0] for role, pod, _ in pods(B.build_children(RUN, s, PLAN))}
        assert set(got) == {C.ROLE_RAY_HEAD, C.ROLE_ROLLOUT, C.ROLE_LEARNER}
        for role, c in got.items():
            probe = c["readinessProbe"]
            assert "livenessProbe" not in c and "startupProbe" not in c, role
            assert probe["periodSeconds"] == 5 and probe["failureThreshold"] >= 2, role
            if role == C.ROLE_RAY_HEAD:
                assert probe["grpc"] == {"port": C.RAY_GCS_PORT}
                assert C.RAY_GCS_PORT in [p["containerPort"] for p in c["ports"]]
            else:
                assert probe["httpGet"]["path"] == READY_PATH and probe["httpGet"]["port"] == "metrics", role
                # The named port is the one the role's process serves /metrics and /ready on.
                assert {"name": "metrics", "containerPort": C.METRICS_PORT, "protocol": "TCP"} in c["ports"], role
        # Init containers (the model's preparation) have none: they run to completion.
        init = B.build_learner_statefulset(RUN, s, PLAN, B.Images())["spec"]["template"]["spec"]["initContainers"]
        assert all("readinessProbe" not in i for i in init)


def test_updates_never_wait_for_a_pod_that_readiness_keeps_out():
    """A rollout pod is Ready once Serve places a replica there, which it does only in place of a
    lost one: an old pod goes before its replacement comes (no surge). A learner rank is Ready only
    once every rank has joined: a changed template replaces all ranks at once."""
    kids = by_kind(B.build_children(RUN, spec(), PLAN))
    assert kids[("Deployment", "grpo-7b-rollout")]["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert kids[("StatefulSet", "grpo-7b-learner")]["spec"]["updateStrategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}}
    assert kids[("Deployment", "grpo-7b-ray-head")]["spec"]["strategy"] == {"type": "Recreate"}
    # Metrics are scraped from pods that are not Ready too (a replica loading, a rank rejoining);
    # the ranks find rank 0, and every node its head, whether or not a probe has passed.
    for name in ("grpo-7b-metrics", "grpo-7b-learner", "grpo-7b-ray-head"):
        assert kids[("Service", name)]["spec"]["publishNotReadyAddresses"] is True, name


def _budgets(kids):
    return {m["metadata"]["labels"][C.LABEL_ROLE]: m for m in kids if m["kind"] == "PodDisruptionBudget"}


def test_disruption_budgets_allow_one_eviction_a_role_while_training_and_open_once_it_is_not():
    kids = B.build_children(RUN, spec(), PLAN)
    budgets = _budgets(kids)
    assert set(budgets) == {C.ROLE_RAY_HEAD, C.ROLE_ROLLOUT, C.ROLE_LEARNER}
    workloads = {m["metadata"]["labels"][C.LABEL_ROLE]: m for m in kids if m["kind"] in ("Deployment", "StatefulSet")}
    for role, pdb in budgets.items():
        assert pdb["apiVersion"] == "policy/v1"
        md = pdb["metadata"]
        assert md["name"] == B.names("grpo-7b")[role] == workloads[role]["metadata"]["name"]
        assert md["labels"][C.LABEL_RUN] == "grpo-7b" and md["ownerReferences"][0]["uid"] == RUN.uid
        sel = pdb["spec"]["selector"]["matchLabels"]
        # It selects its role's pods and no other role's.
        for other, w in workloads.items():
            pod_labels = w["spec"]["template"]["metadata"]["labels"]
            assert (sel.items() <= pod_labels.items()) == (other == role), (role, other)
        # Pods that are not Ready (a rank waiting to rejoin, a crash loop) may always be evicted.
        assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # Training: one eviction at a time per role, never a budget of none (a learner rank's or the head's
    # is one gang restart from the last checkpoint); blockEvictions, where the admin allows it, keeps
    # the head and the ranks.
    assert {r: b["spec"]["maxUnavailable"] for r, b in budgets.items()} == {
        C.ROLE_RAY_HEAD: 1, C.ROLE_LEARNER: 1, C.ROLE_ROLLOUT: 1}
    strict = _budgets(B.build_children(RUN, spec(scheduling={"blockEvictions": True}), PLAN))
    assert {r: b["spec"]["maxUnavailable"] for r, b in strict.items()} == {
        C.ROLE_RAY_HEAD: 0, C.ROLE_LEARNER: 0, C.ROLE_ROLLOUT: 1}
    # Suspended (the admin's way to drain a node) or ended: every pod may go.
    for kids in (B.build_children(RUN, spec(suspend=True), PLAN), B.build_children(RUN, spec(), PLAN, finished=True)):
        assert {b["spec"]["maxUnavailable"] for b in _budgets(kids).values()} == {"100%"}


def test_every_child_has_an_api_path_and_a_rule_that_lets_the_operator_apply_it():
    """The operator applies each child at its API path (operator/kube.py) with get, create and patch
    from the chart's rules (charts/rlscale/templates/_rules.tpl)."""
    import pathlib

    import yaml

    from rlscale.operator.kube import object_path

    text = (pathlib.Path(__file__).parents[2] / "charts/rlscale/templates/_rules.tpl").read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("{{"))
    rules = yaml.safe_load(body)
    s = spec(scheduling={"queueName": "q", "podGroup": True})
    kids = B.build_children(RUN, s, PLAN)
    kids.append(B.build_workload(RUN, s, PLAN, kids))
    assert "PodDisruptionBudget" in {m["kind"] for m in kids}
    for m in kids:
        path = object_path(m["apiVersion"], m["kind"], "team-a", m["metadata"]["name"])
        group = "" if m["apiVersion"] == "v1" else m["apiVersion"].split("/")[0]
        plural = path.split("/")[-2]
        verbs = {v for r in rules if group in r["apiGroups"] and plural in r["resources"] for v in r["verbs"]}
        assert {"get", "create", "patch"} <= verbs, (m["kind"], group, plural, verbs)
        assert "delete" not in verbs, m["kind"]


def test_containers_that_ask_for_no_gpu_see_none():
    """NVIDIA_VISIBLE_DEVICES=none wherever a container requests no GPU (the Ray head, CPU runs, the model
    init container), so an image's own NVIDIA_VISIBLE_DEVICES=all does not hand it the node's GPUs."""
    s = spec(learner={"gpusPerReplica": 2}, rollout={"gpusPerReplica": 1})
    seen = {}
    for role, pod, _ in pods(B.build_children(RUN, s, PLAN)):
        for c in pod.get("initContainers", []) + pod["containers"]:
            gpus = int(((c.get("resources") or {}).get("limits") or {}).get(C.GPU_RESOURCE) or 0)
            env = {e["name"]: e.get("value") for e in c["env"]}
            seen[(role, c["name"])] = (gpus, env.get("NVIDIA_VISIBLE_DEVICES"))
    assert seen[(C.ROLE_RAY_HEAD, C.ROLE_RAY_HEAD)] == (0, "none")
    assert seen[(C.ROLE_LEARNER, C.ROLE_LEARNER)] == (2, None) and seen[(C.ROLE_ROLLOUT, C.ROLE_ROLLOUT)] == (1, None)
    models = [v for (_, name), v in seen.items() if name == "model"]
    assert models and all(v == (0, "none") for v in models), seen
