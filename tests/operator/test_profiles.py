"""Placement profiles (operator/profiles.py, issue 42): the chart's JSON read back or refused naming the field,
how a profile and a run's own placement combine, what is refused, and a run's pods built from them through
the reconcile pass (against the in-memory API server)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml
from fakekube import FakeKube
from policykit import SETTINGS

from rlscale.operator import builders as B
from rlscale.operator import constants as C
from rlscale.operator import profiles as PR
from rlscale.operator.main import run as run_operator
from rlscale.operator.reconcile import Controller
from rlscale.operator.settings import ENV_PLACEMENT_PROFILES, ENV_REQUIRE_PLACEMENT_PROFILE, OperatorSettings
from rlscale.spec import parse_spec
from tests.conftest import EXAMPLES

NS, RUN = "team", "r"
GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
ZONE_A = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
H100 = PR.PlacementProfile("h100", node_selector={"pool": "h100"}, tolerations=(GPU_TAINT,),
                           affinity={"nodeAffinity": {PR._REQUIRED: {"nodeSelectorTerms": [ZONE_A]}}},
                           priority_class_name="team-batch", scheduler_name="volcano", runtime_class_name="nvidia",
                           queue_name="h100")
CPU = PR.PlacementProfile("cpu", node_selector={"pool": "cpu"})


def example(**spec_over) -> dict:
    obj = yaml.safe_load((EXAMPLES / "grpo-h100.yaml").read_text())
    for k, v in spec_over.items():
        obj["spec"][k] = {**obj["spec"].get(k, {}), **v}
    return obj


def spec(**spec_over):
    return parse_spec(example(**spec_over)["spec"])


# ------------------------------------------------------------------ the chart's values


def test_profiles_read_back_what_the_chart_renders():
    assert PR.parse_profiles(PR.to_json((H100, CPU))) == (CPU, H100)  # sorted by name
    assert PR.parse_profiles("") == PR.parse_profiles("null") == PR.parse_profiles("{}") == ()
    env = {ENV_PLACEMENT_PROFILES: PR.to_json((CPU,)), ENV_REQUIRE_PLACEMENT_PROFILE: "true"}
    policy = OperatorSettings.from_env(env).policy
    assert policy.placement_profiles == (CPU,) and policy.require_placement_profile
    assert OperatorSettings.from_env({}).policy.placement_profiles == ()


@pytest.mark.parametrize(("values", "where", "problem"), [
    ({"h100": {"nodeSelectr": {"a": "b"}}}, "policy.placementProfiles.h100.nodeSelectr", "not a profile field"),
    ({"H100": {}}, "policy.placementProfiles.H100 ", "not a Kubernetes name"),
    ({"h100": {"nodeSelector": {"pool": "a b"}}}, "policy.placementProfiles.h100.nodeSelector.pool ",
     "not a valid node label key and value"),
    ({"h100": {"nodeSelector": {"-pool": "a"}}}, "nodeSelector.-pool ", "not a valid node label key"),
    ({"h100": {"tolerations": {"key": "x"}}}, "policy.placementProfiles.h100.tolerations ", "a list of tolerations"),
    ({"h100": {"affinity": {"nodeAfinity": {}}}}, "policy.placementProfiles.h100.affinity ", "nodeAffinity"),
    ({"h100": {"queueName": "a.b"}}, "policy.placementProfiles.h100.queueName ", "not a Kubernetes name"),
    ({"h100": {"priorityClassName": "Batch"}}, "h100.priorityClassName ", "not a Kubernetes name"),
    ({"h100": ["pool"]}, "policy.placementProfiles.h100 ", "a profile is an object"),
    (["h100"], "policy.placementProfiles ", "an object of profile name to profile"),
])
def test_a_bad_profile_is_refused_naming_its_field(values, where, problem):
    with pytest.raises(ValueError) as e:
        PR.parse_profiles(json.dumps(values))
    assert where in str(e.value) and problem in str(e.value) and "fix the rlscale chart value" in str(e.value)


def test_the_operator_does_not_start_on_a_bad_profile(monkeypatch, capsys):
    monkeypatch.setenv(ENV_PLACEMENT_PROFILES, '{"h100": {"tolerations": 1}}')
    assert run_operator() == 2
    assert "policy.placementProfiles.h100.tolerations is 1" in capsys.readouterr().err


# ------------------------------------------------------------------ how a profile and a run combine


def test_without_a_profile_the_spec_is_the_runs_own():
    s = spec()
    assert PR.effective(s, (H100,)) is s
    assert PR.unknown(s, (H100,)) is None and PR.refusal(s, (H100,), False) is None


def test_a_profile_goes_on_every_role_and_the_runs_own_placement_adds_to_it():
    own_taint = {"key": "team-a", "operator": "Exists"}
    s = spec(scheduling={"placementProfile": "h100"},
             learner={"pod": {"nodeSelector": {"rack": "r1"}, "tolerations": [own_taint]}})
    e = PR.effective(s, (CPU, H100))
    assert (e.scheduling.priority_class_name, e.scheduling.scheduler_name, e.scheduling.queue_name) == \
        ("team-batch", "volcano", "h100")
    assert e.learner.pod.node_selector == {"pool": "h100", "rack": "r1"}
    assert e.learner.pod.tolerations == [GPU_TAINT, own_taint]
    assert e.rollout.pod.node_selector == {"pool": "h100"} and e.rollout.pod.tolerations == [GPU_TAINT]
    assert e.rollout.pod.runtime_class_name == e.learner.pod.runtime_class_name == "nvidia"
    # The spec the run wrote is left as it was (the allowlists check it, and a later pass merges again).
    assert s.learner.pod.node_selector == {"rack": "r1"} and s.scheduling.queue_name is None
    assert PR.effective(e, (CPU, H100)).learner.pod.tolerations == [GPU_TAINT, GPU_TAINT, own_taint]


def test_required_node_terms_must_both_hold_and_other_terms_are_joined():
    zone_b = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}
    rack = {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}],
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    pref = [{"weight": 1, "preference": ZONE_A}]
    anti = [{"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"a": "b"}}}]
    profile = {"nodeAffinity": {PR._REQUIRED: {"nodeSelectorTerms": [ZONE_A, zone_b]},
                                "preferredDuringSchedulingIgnoredDuringExecution": pref}}
    own = {"nodeAffinity": {PR._REQUIRED: {"nodeSelectorTerms": [rack]},
                            "preferredDuringSchedulingIgnoredDuringExecution": pref},
           "podAntiAffinity": {PR._REQUIRED: anti}}
    got = PR.merge_affinity(profile, own)
    # (zone a OR zone b) AND rack r1 on node n1: each profile term with the run's term's expressions.
    terms = got["nodeAffinity"][PR._REQUIRED]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": ZONE_A["matchExpressions"] + rack["matchExpressions"],
                      "matchFields": rack["matchFields"]},
                     {"matchExpressions": zone_b["matchExpressions"] + rack["matchExpressions"],
                      "matchFields": rack["matchFields"]}]
    assert got["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == pref + pref
    assert got["podAntiAffinity"] == {PR._REQUIRED: anti}
    assert profile["nodeAffinity"][PR._REQUIRED]["nodeSelectorTerms"] == [ZONE_A, zone_b]  # not changed
    assert PR.merge_affinity(profile, {}) == profile and PR.merge_affinity({}, own) == own


# ------------------------------------------------------------------ what is refused


def test_an_unknown_profile_names_the_field_the_value_and_the_profiles_there_are():
    msg = PR.unknown(spec(scheduling={"placementProfile": "a100"}), (CPU, H100))
    assert "spec.scheduling.placementProfile is 'a100'" in msg and "'cpu', 'h100'" in msg
    assert "policy.placementProfiles" in msg
    assert "profiles are none" in PR.unknown(spec(scheduling={"placementProfile": "a100"}), ())


@pytest.mark.parametrize(("spec_over", "field", "value", "theirs"), [
    ({"learner": {"pod": {"nodeSelector": {"pool": "mine"}}}}, "spec.learner.pod.nodeSelector.pool", "mine",
     "sets nodeSelector.pool to 'h100'"),
    ({"rollout": {"pod": {"priorityClassName": "urgent"}}}, "spec.rollout.pod.priorityClassName", "urgent",
     "sets priorityClassName to 'team-batch'"),
    ({"learner": {"pod": {"runtimeClassName": "runc"}}}, "spec.learner.pod.runtimeClassName", "runc",
     "sets runtimeClassName to 'nvidia'"),
    ({"scheduling": {"placementProfile": "h100", "queueName": "other"}}, "spec.scheduling.queueName", "other",
     "sets queueName to 'h100'"),
    ({"scheduling": {"placementProfile": "h100", "schedulerName": "default-scheduler"}},
     "spec.scheduling.schedulerName", "default-scheduler", "sets schedulerName to 'volcano'"),
], ids=["node-selector-key", "priority-class", "runtime-class", "queue", "scheduler"])
def test_a_run_may_not_override_what_its_profile_sets(spec_over, field, value, theirs):
    s = spec(**{"scheduling": {"placementProfile": "h100"}, **spec_over})
    msg = PR.refusal(s, (H100,), False)
    assert f"{field} is {value!r}" in msg and theirs in msg and "never overrides" in msg
    # The same under a profile that leaves it unset is the run's to set (the allowlists then check it).
    bare = PR.PlacementProfile("h100")
    assert PR.refusal(s, (bare,), False) is None


@pytest.mark.parametrize(("spec_over", "field"), [
    ({"learner": {"pod": {"nodeSelector": {"rack": "r1"}}}}, "spec.learner.pod.nodeSelector"),
    ({"rollout": {"pod": {"tolerations": [GPU_TAINT]}}}, "spec.rollout.pod.tolerations"),
    ({"learner": {"pod": {"affinity": {"nodeAffinity": {}}}}}, "spec.learner.pod.affinity"),
])
def test_where_profiles_are_required_a_run_sets_no_placement_of_its_own(spec_over, field):
    s = spec(scheduling={"placementProfile": "cpu"}, **spec_over)
    msg = PR.refusal(s, (CPU, H100), True)
    assert f"{field} is set" in msg and "policy.requirePlacementProfile" in msg
    assert PR.refusal(s, (CPU, H100), False) is None
    msg = PR.refusal(spec(), (CPU, H100), True)
    assert "spec.scheduling.placementProfile is unset" in msg and "'cpu', 'h100'" in msg
    assert PR.refusal(spec(scheduling={"placementProfile": "cpu"}), (CPU, H100), True) is None


# ------------------------------------------------------------------ the reconcile pass


@pytest.fixture
def fake() -> FakeKube:
    f = FakeKube()
    f.namespace(NS, **{"pod-security.kubernetes.io/enforce": "restricted"})
    return f


def controller(fake: FakeKube, require: bool = False) -> Controller:
    policy = dataclasses.replace(SETTINGS.policy, placement_profiles=(CPU, H100), require_placement_profile=require)
    return Controller(fake, dataclasses.replace(SETTINGS, policy=policy))


def create(fake: FakeKube, **spec_over) -> None:
    obj = example(**spec_over)
    obj["metadata"] = {"name": RUN, "namespace": NS}
    fake.create(obj)


def conditions(fake: FakeKube) -> dict[str, dict]:
    st = fake.get("rlscale.dev/v1alpha1", C.RLRUN_KIND, NS, RUN)["status"]
    return {c["type"]: c for c in st["conditions"]}


def templates(fake: FakeKube) -> dict[str, dict]:
    kinds = {C.ROLE_RAY_HEAD: "Deployment", C.ROLE_ROLLOUT: "Deployment", C.ROLE_LEARNER: "StatefulSet"}
    return {role: fake.get("apps/v1", kind, NS, B.names(RUN)[role])["spec"]["template"]["spec"]
            for role, kind in kinds.items()}


def test_a_runs_pods_and_its_workload_get_its_profile(fake):
    # The profile's node label, taint, classes, scheduler and queue are in no allowlist of the tests' policy.
    create(fake, scheduling={"placementProfile": "h100"})
    o = controller(fake).reconcile(NS, RUN, "create")
    assert o.refusal is None, o.refusal
    for role, pod in templates(fake).items():
        assert pod["nodeSelector"] == {"pool": "h100"} and pod["tolerations"] == [GPU_TAINT], role
        assert pod["affinity"] == H100.affinity and pod["priorityClassName"] == "team-batch", role
        assert pod["schedulerName"] == "volcano", role
        # The runtime class goes on the rollout and learner pods; the Ray head asks for no GPU.
        assert pod.get("runtimeClassName") == (None if role == C.ROLE_RAY_HEAD else "nvidia"), role
    wl = fake.get(C.KUEUE_API, "Workload", NS, B.names(RUN)[C.ROLE_QUEUE])
    assert wl["spec"]["queueName"] == "h100"
    assert conditions(fake)[C.COND_ADMITTED]["reason"] == "Queued"


def test_a_run_naming_a_profile_the_cluster_lacks_is_invalid_and_gets_nothing(fake):
    create(fake, scheduling={"placementProfile": "a100"})
    ctl = controller(fake)
    o = ctl.reconcile(NS, RUN, "create")
    conds = conditions(fake)
    assert o.refusal[0] == conds[C.COND_INVALID]["reason"] == PR.UNKNOWN_PROFILE
    assert "spec.scheduling.placementProfile is 'a100'" in conds[C.COND_INVALID]["message"]
    assert "'cpu', 'h100'" in conds[C.COND_INVALID]["message"] and conds[C.COND_PLANNED]["status"] == "False"
    assert not [k for k in fake.objects if k[1] in ("Deployment", "StatefulSet", "Secret")]
    # Ended, not retried: the next pass finds the same and raises nothing.
    assert ctl.reconcile(NS, RUN, "progress").refusal[0] == PR.UNKNOWN_PROFILE


def test_where_profiles_are_required_a_runs_own_node_selector_is_not_allowed(fake):
    create(fake, scheduling={"placementProfile": "cpu"}, learner={"pod": {"nodeSelector": {"pool": "h100"}}})
    controller(fake, require=True).reconcile(NS, RUN, "create")
    failed = conditions(fake)[C.COND_FAILED]
    assert failed["reason"] == "NotAllowed" and "spec.learner.pod.nodeSelector is set" in failed["message"]
    assert not [k for k in fake.objects if k[1] in ("Deployment", "StatefulSet")]
