"""The tool pods (spec.task.toolSandbox.isolation: pod) as the operator builds them, and the admin's RuntimeClass
allowlist over them: pure, no cluster (tests/operator/test_policy_cluster.py applies them to an API server)."""

from __future__ import annotations

import pytest

from rlscale.operator import builders as B
from rlscale.operator import constants as C
from rlscale.operator import policy as P
from rlscale.plan import Plan
from rlscale.spec import parse_spec
from rlscale.spec.tools import TOOL_SERVER_ENV, TOOL_SERVER_PORT

RUN = B.RunRef(name="tools", namespace="team-a", uid="0000-1111")
PLAN = Plan.from_dict({"prompts": 16, "samplesPerPrompt": 8, "learningRate": 5e-4, "rolloutReplicas": 1,
                       "learnerReplicas": 1, "reason": "fixed",
                       "predicted": {"samplesPerSecond": 100.0, "stepSeconds": 1.0, "timeToTargetSeconds": 60.0,
                                     "samplesToTarget": 1000.0,
                                     "phases": {"generate": 0.5, "reward": 0.01, "train": 0.4, "sync": 0.09}}})
TOOLS = [{"name": "calculator", "builtin": "calculator"}, {"name": "python", "builtin": "python"}]


def spec(sandbox=None, **over):
    task = {"name": "builtin:tool-arithmetic", "tools": TOOLS, "toolWorkers": 3, "toolMemoryMb": 512}
    if sandbox is not None:
        task["toolSandbox"] = sandbox
    base = {"model": {"path": "builtin:tiny-tools"}, "hardware": {"accelerator": "cpu"}, "budget": {"gpus": 0},
            "rollout": {"gpusPerReplica": 0}, "learner": {"gpusPerReplica": 0}, "task": task}
    base.update(over)
    return parse_spec(base)


def kids(s, **kw):
    return {(m["kind"], m["metadata"]["name"]): m for m in B.build_children(RUN, s, PLAN, **kw)}


POD = {"isolation": "pod", "runtimeClassName": "gvisor", "replicas": 2}


def test_tool_pods_run_the_tool_server_under_the_runtime_class_with_nothing_of_the_run():
    k = kids(spec(POD, learner={"pod": {"nodeSelector": {"pool": "cpu"}, "runtimeClassName": "nvidia",
                                        "env": [{"name": "TEAM", "value": "a"}]}}))
    dep = k[("Deployment", "tools-tools")]
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "gvisor"  # the sandbox's, not the learner's nvidia
    assert pod["nodeSelector"] == {"pool": "cpu"}  # lands where the learners may
    assert pod["automountServiceAccountToken"] is False
    (c,) = pod["containers"]
    assert c["command"][:2] == ["rlscale", "tool-server"] and str(TOOL_SERVER_PORT) in c["command"]
    env = {e["name"]: e for e in c["env"]}
    assert "RAY_AUTH_TOKEN" not in env and "TEAM" not in env and env["NVIDIA_VISIBLE_DEVICES"]["value"] == "none"
    assert {v["name"] for v in pod["volumes"]} == {"run-config", "home", "tmp"}  # no model, checkpoint, token
    assert c["securityContext"]["readOnlyRootFilesystem"] and pod["securityContext"]["runAsNonRoot"]
    assert c["readinessProbe"]["httpGet"]["path"] == C.READY_PATH
    assert c["resources"]["limits"]["memory"] == f"{3 * 512 + 256}Mi"
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels[C.LABEL_ROLE] == C.ROLE_TOOLS and labels[C.LABEL_RUN] == "tools"


def test_the_learner_calls_the_tool_service_and_only_it_gets_in_and_nothing_gets_out():
    k = kids(spec(POD))
    svc = k[("Service", "tools-tools")]
    assert svc["spec"]["ports"][0]["port"] == TOOL_SERVER_PORT
    assert svc["spec"]["selector"][C.LABEL_ROLE] == C.ROLE_TOOLS
    learner = k[("StatefulSet", "tools-learner")]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in learner["env"]}
    assert env[TOOL_SERVER_ENV] == f"http://tools-tools.team-a.svc:{TOOL_SERVER_PORT}"
    np = k[("NetworkPolicy", "tools-tools")]["spec"]
    assert np["policyTypes"] == ["Ingress", "Egress"] and np["egress"] == []
    (rule,) = np["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {C.LABEL_RUN: "tools", C.LABEL_ROLE: C.ROLE_LEARNER}}}]
    assert rule["ports"] == [{"port": TOOL_SERVER_PORT, "protocol": "TCP"}]


def test_the_runs_own_policy_leaves_the_tool_pods_out_but_lets_the_learner_call_them():
    run_np = kids(spec(POD))[("NetworkPolicy", "tools-network")]["spec"]
    notin = {"key": C.LABEL_ROLE, "operator": "NotIn", "values": [C.ROLE_TOOLS]}
    assert run_np["podSelector"]["matchExpressions"] == [notin]
    assert run_np["ingress"][0]["from"][0]["podSelector"]["matchExpressions"] == [notin]
    to_tools = [r for r in run_np["egress"] if r.get("ports") == [{"port": TOOL_SERVER_PORT, "protocol": "TCP"}]]
    assert to_tools and to_tools[0]["to"][0]["podSelector"]["matchLabels"][C.LABEL_ROLE] == C.ROLE_TOOLS
    # A run without tool pods keeps the policy it had.
    plain = kids(spec())[("NetworkPolicy", "tools-network")]["spec"]
    assert plain["podSelector"] == {"matchLabels": {C.LABEL_RUN: "tools"}}


def test_the_tool_pods_policy_is_made_even_where_the_chart_makes_no_run_policy():
    k = kids(spec(POD), images=B.Images(network_policy=False))
    assert ("NetworkPolicy", "tools-tools") in k and ("NetworkPolicy", "tools-network") not in k


@pytest.mark.parametrize("over", [{"suspend": True}, {}])
def test_tool_pods_run_while_the_learners_do(over):
    finished = not over
    dep = kids(spec(POD, **over), finished=finished)[("Deployment", "tools-tools")]
    assert dep["spec"]["replicas"] == 0


@pytest.mark.parametrize("sandbox", [None, {"isolation": "process"}])
def test_tools_beside_the_driver_make_no_tool_objects(sandbox):
    k = kids(spec(sandbox))
    assert not [key for key in k if key[1] == "tools-tools"]
    learner = k[("StatefulSet", "tools-learner")]["spec"]["template"]["spec"]["containers"][0]
    assert TOOL_SERVER_ENV not in {e["name"] for e in learner["env"]}


def test_the_admin_allowlist_decides_the_tool_runtime_class():
    s = spec(POD)
    msg = P.refusal(s, [], P.Policy(runtime_class_names=("kata",)))
    assert msg and msg.startswith("spec.task.toolSandbox.runtimeClassName is 'gvisor'")
    assert "policy.runtimeClassNames" in msg and "'kata'" in msg
    assert P.refusal(s, [], P.Policy(runtime_class_names=("gvisor",))) is None
    # No RuntimeClass asked for: the node's default runtime, nothing to allow.
    assert P.refusal(spec({"isolation": "pod"}), [], P.Policy()) is None


def test_a_user_cannot_point_the_driver_at_a_tool_server_of_their_own():
    from rlscale.spec import SpecError

    with pytest.raises(SpecError, match="choose another name"):
        spec(POD, learner={"pod": {"env": [{"name": TOOL_SERVER_ENV, "value": "http://evil:80"}]}})
