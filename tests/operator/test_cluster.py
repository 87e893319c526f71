"""The operator on the real control plane (etcd, kube-apiserver, controller-manager, scheduler,
kwok GPU nodes) built from Go modules, running as the service account its chart ships."""

from __future__ import annotations

import json
import re
import time

import pytest
from clusterkit import OPERATOR_NS, OPERATOR_SA, example_run, wait_for
from driverkit import measured, step_seconds

from rlscale.kube_report import KubeTarget, ProgressReporter
from rlscale.operator import builders as B
from rlscale.operator import constants as C
from rlscale.plan import Calibration, Plan
from rlscale.progress_report import ProgressReport

pytestmark = pytest.mark.cluster


def rlrun(kube, name, ns):
    return kube.get("rlrun", name, ns) or {}


def cond(obj, type_):
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def reporter_for(kube, cluster, name, ns, as_run=None):
    """The driver's own reporter, authenticated with the run's runner account token, as in the pod;
    `as_run`: the RLRun it patches (another run's, to show it is refused)."""
    token = kube.run("create", "token", B.names(name)[C.ROLE_RUNNER], "-n", ns).stdout.strip()
    return ProgressReporter(KubeTarget(cluster.server, token, str(cluster.dir / "pki" / "ca.crt"), ns, as_run or name))


def send(reporter, **fields):
    """A progress report as the driver sends it (camelCase on the wire); True when the API took it."""
    return reporter.report(ProgressReport.from_wire(fields), force=True)


def configmap_plan(kube, name, ns):
    return Plan.from_dict(json.loads(kube.get("configmap", B.names(name)[C.ROLE_CONFIG], ns)["data"][C.CONFIG_KEY])
                          ["plan"])


def workloads(kube, name, ns):
    n = B.names(name)
    return kube.get("deployment", n[C.ROLE_ROLLOUT], ns), kube.get("statefulset", n[C.ROLE_LEARNER], ns)


def running_pods(kube, name, ns, role):
    pods = kube.get("pods", ns=ns, selector=f"{C.LABEL_RUN}={name},{C.LABEL_ROLE}={role}")["items"]
    return [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


def wait_running(kube, name, ns, timeout=60):
    """Until the run is Running with the planned replica counts; returns the RLRun."""
    def ok():
        r = rlrun(kube, name, ns)
        st = r.get("status") or {}
        return r if st.get("phase") == C.PHASE_RUNNING else None
    return wait_for(f"RLRun {ns}/{name} phase Running", ok, timeout)


def test_apply_creates_planned_children_and_pods_run_on_fake_gpu_nodes(kube, operator, ns):
    kube.apply(example_run("grpo"), ns)
    r = wait_running(kube, "grpo", ns)
    plan = r["status"]["plan"]
    assert plan["rolloutReplicas"] >= 1 and plan["learnerReplicas"] >= 1 and plan["reason"]
    dep, sts = workloads(kube, "grpo", ns)
    assert dep["spec"]["replicas"] == plan["rolloutReplicas"]
    assert sts["spec"]["replicas"] == plan["learnerReplicas"]
    # Every child: owned by the run, labelled with run and role.
    uid = r["metadata"]["uid"]
    for kind in ("configmap", "service", "deployment", "statefulset", "pod", "serviceaccount", "role", "rolebinding"):
        items = kube.get(kind, ns=ns, selector=f"{C.LABEL_RUN}=grpo")["items"]
        assert items, kind
        for it in items:
            refs = it["metadata"].get("ownerReferences") or []
            direct = [x for x in refs if x["kind"] == "RLRun"]
            if kind == "pod" and not direct:  # workload pods are owned through their controller
                continue
            assert direct and direct[0]["uid"] == uid, (kind, it["metadata"]["name"])
            assert it["metadata"]["labels"][C.LABEL_ROLE]
    # Pods Running on kwok nodes, each with the GPUs the plan asked for.
    learners = running_pods(kube, "grpo", ns, C.ROLE_LEARNER)
    rollouts = running_pods(kube, "grpo", ns, C.ROLE_ROLLOUT)
    assert len(learners) == plan["learnerReplicas"] and len(rollouts) == plan["rolloutReplicas"]
    for p in learners + rollouts:
        assert p["spec"]["nodeName"].startswith("gpu-node-")
        assert p["spec"]["containers"][0]["resources"]["limits"][C.GPU_RESOURCE] == "1"
    ranks = sorted(int(p["metadata"]["labels"][C.LABEL_POD_INDEX]) for p in learners)
    assert ranks == list(range(plan["learnerReplicas"]))  # RANK comes from this label
    rank_env = next(e for e in learners[0]["spec"]["containers"][0]["env"] if e["name"] == "RANK")
    assert C.LABEL_POD_INDEX in rank_env["valueFrom"]["fieldRef"]["fieldPath"]
    assert running_pods(kube, "grpo", ns, C.ROLE_RAY_HEAD)
    # Conditions carry reason, message, lastTransitionTime and observedGeneration.
    gen = r["metadata"]["generation"]
    for t in (C.COND_PLANNED, C.COND_ROLLOUT_READY, C.COND_LEARNERS_READY):
        c = cond(r, t)
        assert c["status"] == "True" and c["reason"] and c["message"] and c["lastTransitionTime"], c
        assert c["observedGeneration"] == gen
    assert cond(r, C.COND_INVALID)["status"] == "False"
    # `kubectl get rlrun` shows the plan at a glance.
    table = kube.run("get", "rlrun", "grpo", "-n", ns).stdout
    header, row = table.splitlines()[:2]
    assert header.split()[:6] == ["NAME", "PHASE", "BATCH", "LR", "ROLLOUT", "LEARNER"]
    cols = row.split()
    assert cols[:3] == ["grpo", "Running", plan["batch"]]
    assert float(cols[3]) == pytest.approx(plan["learningRate"])
    assert cols[4:6] == [str(plan["rolloutReplicas"]), str(plan["learnerReplicas"])]


def test_spec_change_replans_and_scales_roles_independently(kube, operator, ns):
    kube.apply(example_run("scale"), ns)
    wait_running(kube, "scale", ns)
    dep0, sts0 = workloads(kube, "scale", ns)
    want = max(1, dep0["spec"]["replicas"] - 3)
    kube.patch("rlrun", "scale", ns, {"spec": {"rollout": {"replicas": want}}})
    wait_for("rollout scaled", lambda: workloads(kube, "scale", ns)[0]["spec"]["replicas"] == want)
    r = wait_for("status re-planned", lambda: (x := rlrun(kube, "scale", ns))["status"].get("observedGeneration")
                 == x["metadata"]["generation"] and x)
    assert r["status"]["plan"]["rolloutReplicas"] == want
    _, sts1 = workloads(kube, "scale", ns)
    # The learner StatefulSet was not touched: same generation, same replicas.
    assert sts1["metadata"]["generation"] == sts0["metadata"]["generation"]
    assert sts1["spec"]["replicas"] == sts0["spec"]["replicas"]
    wait_for("rollout pods follow", lambda: len(running_pods(kube, "scale", ns, C.ROLE_ROLLOUT)) == want)
    # And the other way: learners change, rollout stays.
    learners = max(1, sts0["spec"]["replicas"] // 2)
    kube.patch("rlrun", "scale", ns, {"spec": {"learner": {"replicas": learners}}})
    wait_for("learners scaled", lambda: workloads(kube, "scale", ns)[1]["spec"]["replicas"] == learners)
    assert workloads(kube, "scale", ns)[0]["spec"]["replicas"] == want


def test_suspend_scales_to_zero_and_resume_restores(kube, operator, ns):
    kube.apply(example_run("pause"), ns)
    r = wait_running(kube, "pause", ns)
    plan = r["status"]["plan"]
    kube.patch("rlrun", "pause", ns, {"spec": {"suspend": True}})
    wait_for("both roles at zero", lambda: [w["spec"]["replicas"] for w in workloads(kube, "pause", ns)] == [0, 0])
    wait_for("phase Suspended", lambda: rlrun(kube, "pause", ns)["status"].get("phase") == C.PHASE_SUSPENDED)
    assert kube.get("configmap", B.names("pause")[C.ROLE_CONFIG], ns)  # config kept
    assert cond(rlrun(kube, "pause", ns), C.COND_SUSPENDED)["status"] == "True"
    wait_for("pods gone", lambda: not running_pods(kube, "pause", ns, C.ROLE_LEARNER)
             and not running_pods(kube, "pause", ns, C.ROLE_ROLLOUT))
    kube.patch("rlrun", "pause", ns, {"spec": {"suspend": False}})
    wait_running(kube, "pause", ns)
    dep, sts = workloads(kube, "pause", ns)
    assert (dep["spec"]["replicas"], sts["spec"]["replicas"]) == (plan["rolloutReplicas"], plan["learnerReplicas"])


def test_delete_removes_every_child(kube, operator, ns):
    kube.apply(example_run("gone"), ns)
    wait_running(kube, "gone", ns)
    kube.run("delete", "rlrun", "gone", "-n", ns, "--wait=true", "--timeout=30s")
    sel = f"{C.LABEL_RUN}=gone"
    wait_for("children garbage-collected", lambda: all(
        not kube.get(k, ns=ns, selector=sel)["items"]
        for k in ("configmap", "service", "deployment", "statefulset", "serviceaccount", "role", "rolebinding")), 45)


@pytest.mark.parametrize("patch,message", [
    ({"batch": {"samplesPerPrompt": 1}}, "batch.samplesPerPrompt must be >= 2 for GRPO"),
    ({"batch": {"minPrompts": 64, "maxPrompts": 8}}, "batch.minPrompts must be <= batch.maxPrompts"),
    ({"learner": {"zeroStage": 5}}, "spec.learner.zeroStage"),
    ({"budget": {"gpus": 1}, "placement": "disaggregated"}, "budget.gpus must cover at least one learner replica, "
     "and one rollout replica unless colocated"),
    ({"learner": {"gpusPerReplica": 2, "ranksPerReplica": 4}},
     "learner.ranksPerReplica must equal learner.gpusPerReplica"),
    ({"placement": "colocated", "rollout": {"replicas": 2}}, "rollout.replicas must be auto with placement colocated"),
    ({"batch": {"microBatchTokens": 16}}, "batch.microBatchTokens must hold one sequence"),
    ({"batch": {"promptz": 8}}, 'unknown field "spec.batch.promptz"'),
    ({"learner": {"pod": {"env": [{"name": "WORLD_SIZE", "value": "9"}]}}},
     "learner.pod.env must not set a variable the operator sets"),
    ({"rollout": {"pod": {"volumes": [{"name": "data", "emptyDir": {}}],
                          "volumeMounts": [{"name": "data", "mountPath": "/tmp"}]}}},
     "each rollout.pod.volumeMounts entry must name a volume of rollout.pod.volumes"),
    ({"task": {"pluginVolume": {"configMap": {"name": "my-reward"}}}},
     "task.pluginVolume needs a plug-in (module:function) in task.reward"),
])
def test_bad_specs_are_refused_at_admission_with_a_clear_message(kube, ns, patch, message):
    out = kube.apply(example_run("bad", **patch), ns, check=False)
    assert out.returncode != 0
    assert message in out.stderr, out.stderr
    assert kube.get("rlrun", "bad", ns) is None


@pytest.mark.parametrize("name", ["quick.start", "a" * 64, "1st-run"])
def test_names_its_services_cannot_carry_are_refused_at_admission(kube, ns, name):
    obj = example_run("x")
    obj["metadata"]["name"] = name
    out = kube.apply(obj, ns, check=False)
    assert out.returncode != 0
    assert ("metadata.name must be at most 63 characters" in out.stderr
            or "must be no more than" in out.stderr), out.stderr


def test_spec_only_the_planner_can_judge_is_reported_as_invalid(kube, operator, ns):
    kube.apply(example_run("unknown-model", model={"path": "acme/secret-model-7b"}), ns)
    r = wait_for("Invalid condition", lambda: (x := rlrun(kube, "unknown-model", ns))
                 and cond(x, C.COND_INVALID).get("status") == "True" and x)
    c = cond(r, C.COND_INVALID)
    assert c["reason"] == "PlanFailed" and "spec.model.shape" in c["message"] and "acme/secret-model-7b" in c["message"]
    assert r["status"]["phase"] == C.PHASE_FAILED
    assert not kube.get("deployment", ns=ns, selector=f"{C.LABEL_RUN}=unknown-model")["items"]
    # Fixing the spec recovers the run.
    kube.patch("rlrun", "unknown-model", ns, {"spec": {"model": {"path": "Qwen/Qwen2.5-7B"}}})
    wait_running(kube, "unknown-model", ns)
    assert cond(rlrun(kube, "unknown-model", ns), C.COND_INVALID)["status"] == "False"


def test_deleted_children_are_recreated(kube, operator, ns):
    kube.apply(example_run("heal"), ns)
    wait_running(kube, "heal", ns)
    n = B.names("heal")
    for kind, name in (("deployment", n[C.ROLE_ROLLOUT]), ("configmap", n[C.ROLE_CONFIG]),
                       ("deployment", n[C.ROLE_RAY_HEAD]), ("service", n[C.ROLE_LEARNER])):
        old = kube.get(kind, name, ns)["metadata"]["uid"]
        kube.run("delete", kind, name, "-n", ns, "--wait=true", "--timeout=30s")
        wait_for(f"{kind} {name} recreated",
                 lambda k=kind, n=name, o=old: (x := kube.get(k, n, ns)) and x["metadata"]["uid"] != o)
    wait_running(kube, "heal", ns)


def test_operator_killed_mid_reconcile_converges_without_duplicates(kube, operator, ns):
    operator.kill()
    # Slow the applies down so that the kill lands between two of them; watch only this
    # namespace so that resuming other tests' runs does not queue ahead of this one.
    operator.start("--namespace", ns, RLSCALE_OPERATOR_STEP_DELAY="1.0")
    try:
        kube.apply(example_run("crash"), ns)
        n = B.names("crash")
        try:
            wait_for("config map applied", lambda: kube.get("configmap", n[C.ROLE_CONFIG], ns), 30, 0.05)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\noperator log:\n{operator.log_tail()}") from None
        assert kube.get("statefulset", n[C.ROLE_LEARNER], ns) is None  # really mid-way
    finally:
        operator.kill()
        operator.start()
    wait_running(kube, "crash", ns)
    sel = f"{C.LABEL_RUN}=crash"
    assert len(kube.get("deployment", ns=ns, selector=f"{sel},{C.LABEL_ROLE}={C.ROLE_ROLLOUT}")["items"]) == 1
    assert len(kube.get("deployment", ns=ns, selector=f"{sel},{C.LABEL_ROLE}={C.ROLE_RAY_HEAD}")["items"]) == 1
    assert len(kube.get("statefulset", ns=ns, selector=sel)["items"]) == 1
    assert len(kube.get("pod", ns=ns, selector=f"{sel},{C.LABEL_ROLE}={C.ROLE_RAY_HEAD}")["items"]) == 1
    assert len(kube.get("configmap", ns=ns, selector=sel)["items"]) == 1
    r = rlrun(kube, "crash", ns)
    dep, sts = workloads(kube, "crash", ns)
    assert (dep["spec"]["replicas"], sts["spec"]["replicas"]) == (
        r["status"]["plan"]["rolloutReplicas"], r["status"]["plan"]["learnerReplicas"])


def test_progress_reported_by_the_learner_feeds_status_and_re_plans_at_two_agreeing_re_plans(kube, operator, ns,
                                                                                               cluster):
    # target.expectedSamples: a measured samples-to-target, so status shows an ETA (no placeholder's time)
    kube.apply(example_run("prog", target={"expectedSamples": 400_000}), ns)
    r = wait_running(kube, "prog", ns)
    plan0 = Plan.from_dict(r["status"]["plan"])
    # The learner reports as its own service account, which may patch only its own RLRun.
    runner = f"system:serviceaccount:{ns}:{B.names('prog')[C.ROLE_RUNNER]}"
    can = kube.run("auth", "can-i", "patch", "rlruns/prog", "-n", ns, f"--as={runner}", check=False)
    assert can.stdout.strip() == "yes"
    cannot = kube.run("auth", "can-i", "patch", "rlruns/other", "-n", ns, f"--as={runner}", check=False)
    assert cannot.stdout.strip() == "no"
    # What the driver measured at its first re-plan point: generation 3x faster and training 3x slower
    # than predicted, so fewer prompts on fewer rollout replicas look clearly faster.
    m25 = measured(plan0, 25, generate=0.3, train=3, noise=512.0)
    report = {"step": 25, "samples": 25 * plan0.batch, "reward": 0.42, "targetMetric": 0.61,
              "samplesPerSecond": 20.0, "measurements": m25}
    reporter = reporter_for(kube, cluster, "prog", ns)
    assert send(reporter, **report)
    other = reporter_for(kube, cluster, "prog", ns, as_run="metered")
    assert not send(other, **report)  # refused: not its own run (and it does not raise)
    r = wait_for("progress in status", lambda: (x := rlrun(kube, "prog", ns))["status"].get("progress", {})
                 .get("step") == 25 and x)
    assert r["status"]["progress"]["reward"] == 0.42 and r["status"]["progress"]["timeToTarget"].startswith("eta ")
    # One re-plan that finds a faster configuration proposes it; the plan stays, predicted anew.
    st = r["status"]
    assert st["replan"]["count"] == 1 and "applied if the next re-plan agrees" in st["replan"]["message"], st
    kept = Plan.from_dict(st["plan"])
    assert kept.key == plan0.key and kept.predicted.step_seconds == pytest.approx(step_seconds(m25), rel=0.05)
    assert configmap_plan(kube, "prog", ns).key == plan0.key
    assert workloads(kube, "prog", ns)[0]["spec"]["replicas"] == plan0.rollout_replicas
    row = kube.run("get", "rlrun", "prog", "-n", ns).stdout.splitlines()[1]
    assert "0.42" in row.split() and re.search(r"eta \d", row)
    # The next re-plan agrees: the operator switches, and the children follow.
    m50 = measured(plan0, 50, generate=0.3, train=3, noise=512.0)
    assert send(reporter, **dict(report, step=50, samples=50 * plan0.batch, measurements=m50))
    r = wait_for("re-plan", lambda: (x := rlrun(kube, "prog", ns))
                 and cond(x, C.COND_PLANNED).get("reason") == "PlannedReplan" and x)
    new = Plan.from_dict(r["status"]["plan"])
    assert new.key != plan0.key and new.rollout_replicas != plan0.rollout_replicas
    assert "in 2 re-plans in a row" in cond(r, C.COND_PLANNED)["message"] and new.reason in cond(r, C.COND_PLANNED)[
        "message"]
    assert r["status"]["calibration"] == Calibration.from_dict(m50["calibration"]).to_dict()
    # A re-plan never changes the data-parallel size the checkpoints were written at.
    assert new.learner_replicas == plan0.learner_replicas
    wait_for("the ConfigMap's plan", lambda: configmap_plan(kube, "prog", ns) == new)
    wait_for("rollout replicas", lambda: workloads(kube, "prog", ns)[0]["spec"]["replicas"] == new.rollout_replicas)
    assert workloads(kube, "prog", ns)[1]["spec"]["replicas"] == plan0.learner_replicas
    wait_for("rollout pods follow", lambda: len(running_pods(kube, "prog", ns, C.ROLE_ROLLOUT)) == new.rollout_replicas)
    done = dict(report, step=60, targetReached=True, targetMetric=0.86, elapsedSeconds=252)
    assert send(reporter, **done)
    r = wait_for("Succeeded", lambda: (x := rlrun(kube, "prog", ns))["status"].get("phase") == C.PHASE_SUCCEEDED and x)
    assert cond(r, C.COND_TARGET_REACHED)["status"] == "True"
    assert r["status"]["progress"]["timeToTarget"] == "4m12s"
    # Target reached is not yet the end: the workloads keep running until the driver's last
    # report says how the run ended.
    dep, sts = workloads(kube, "prog", ns)
    assert dep["spec"]["replicas"] >= 1 and sts["spec"]["replicas"] >= 1


def test_a_spent_budget_ends_the_run_as_budget_exhausted(kube, operator, ns, cluster):
    kube.apply(example_run("spent"), ns)
    wait_running(kube, "spent", ns)
    reporter = reporter_for(kube, cluster, "spent", ns)
    assert send(reporter, step=60, samples=7680, targetMetric=0.5, samplesPerSecond=200.0, targetReached=False,
                outcome="BudgetExhausted")
    # The CRD's phase enum once lacked this phase, and the API server refused the status (422).
    r = wait_for("phase BudgetExhausted",
                 lambda: (x := rlrun(kube, "spent", ns))["status"].get("phase") == C.PHASE_BUDGET_EXHAUSTED and x)
    assert cond(r, C.COND_BUDGET_EXHAUSTED)["status"] == "True"
    wait_for("the spent run's learners at zero",
             lambda: kube.get("statefulset", B.names("spent")[C.ROLE_LEARNER], ns)["spec"]["replicas"] == 0)


def test_the_drivers_last_report_ends_the_run_and_frees_every_workload(kube, operator, ns, cluster):
    kube.apply(example_run("ends"), ns)
    wait_running(kube, "ends", ns)
    reporter = reporter_for(kube, cluster, "ends", ns)
    last = {"step": 40, "samples": 20480, "reward": 0.7, "targetMetric": 0.86, "samplesPerSecond": 90.0,
            "targetReached": True, "elapsedSeconds": 200, "timeToTargetSeconds": 190.5, "samplesToTarget": 19456,
            "outcome": "Succeeded", "report": "/checkpoints/report on ends-learner-0"}
    assert send(reporter, **last)
    r = wait_for("phase Succeeded",
                 lambda: (x := rlrun(kube, "ends", ns))["status"].get("phase") == C.PHASE_SUCCEEDED and x)
    c = cond(r, C.COND_SUCCEEDED)
    assert c["status"] == "True" and "19456 samples" in c["message"] and "ends-learner-0" in c["message"]
    n = B.names("ends")

    def all_zero():
        kinds = (("deployment", n[C.ROLE_ROLLOUT]), ("statefulset", n[C.ROLE_LEARNER]),
                 ("deployment", n[C.ROLE_RAY_HEAD]))
        return all(kube.get(k, name, ns)["spec"]["replicas"] == 0 for k, name in kinds)
    wait_for("every workload of the ended run at zero", all_zero)
    wait_for("no pods left", lambda: not kube.get("pods", ns=ns, selector=f"{C.LABEL_RUN}=ends")["items"], 60)
    r = rlrun(kube, "ends", ns)
    assert r["status"]["phase"] == C.PHASE_SUCCEEDED  # the scale-down does not turn it Pending
    assert r["status"]["progress"]["timeToTarget"] == "3m10s" and r["status"]["progress"]["samplesToTarget"] == 19456
    row = kube.run("get", "rlrun", "ends", "-n", ns).stdout.splitlines()[1]
    assert "Succeeded" in row.split() and "3m10s" in row.split()
    # A restarted operator keeps the ended run at zero (no second start).
    operator.kill()
    operator.start()
    time.sleep(3)
    assert all_zero() and rlrun(kube, "ends", ns)["status"]["phase"] == C.PHASE_SUCCEEDED


def test_operator_metrics_and_its_rbac_is_exactly_what_the_chart_ships(kube, operator, ns):
    # target.expectedSamples: a measured samples-to-target, without which no predicted time is published
    kube.apply(example_run("metered", target={"expectedSamples": 400_000}), ns)
    wait_running(kube, "metered", ns)
    text = wait_for("run metrics", lambda: (t := operator.metrics()) and 'run="metered"' in t and t)
    assert re.search(r"^rlscale_operator_reconciles_total\{result=\"ok\"\} [1-9]", text, re.M)
    assert "rlscale_operator_reconcile_seconds_bucket" in text
    assert re.search(rf'rlscale_operator_planned_batch_samples\{{namespace="{ns}",run="metered"\}} [1-9]', text)
    assert re.search(rf'rlscale_operator_replicas\{{namespace="{ns}",role="learner",'
                     rf'run="metered",state="ready"\}} [1-9]', text)
    assert f'rlscale_operator_predicted_time_to_target_seconds{{namespace="{ns}",run="metered"}}' in text
    sa = f"system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}"
    def can(*args):
        return kube.run("auth", "can-i", *args, f"--as={sa}", check=False).stdout.strip()
    assert can("patch", "rlruns/status", "-n", ns) == "yes"
    assert can("create", "statefulsets", "-n", ns) == "yes"
    # Pods: read, and patched for one annotation (the rollout pods a scale-down removes first).
    assert can("patch", "pods", "-n", ns) == "yes"
    # Nothing beyond what it uses: no secrets, no deletes, no cluster-wide RBAC.
    assert can("get", "secrets", "-n", ns) == "no"
    assert can("delete", "deployments", "-n", ns) == "no"
    assert can("delete", "pods", "-n", ns) == "no"
    assert can("create", "clusterroles") == "no"
    # And what it has was enough: the API server refused it nothing.
    refused = [line for line in operator.log_tail(100000).splitlines()
               if f'User \\"{sa}\\" cannot' in line or f'User "{sa}" cannot' in line]
    assert not refused, "\n".join(refused[:5])


def test_a_driver_failure_fails_the_run_and_a_spec_change_retries_it(kube, operator, ns, cluster):
    kube.apply(example_run("oops"), ns)
    wait_running(kube, "oops", ns)
    assert kube.get("secret", B.names("oops")[C.ROLE_TOKEN], ns)  # the run's Ray token
    assert kube.get("networkpolicy", B.names("oops")[C.ROLE_NETWORK], ns)
    reporter = reporter_for(kube, cluster, "oops", ns)
    # A transient error: Degraded, the run goes on.
    assert send(reporter, failed=True, message="RuntimeError: replica died", targetReached=False)
    r = wait_for("Degraded",
                 lambda: (x := rlrun(kube, "oops", ns)) and cond(x, C.COND_DEGRADED).get("status") == "True" and x)
    assert "replica died" in cond(r, C.COND_DEGRADED)["message"] and r["status"]["phase"] != C.PHASE_FAILED
    # One a restart would meet again: Failed at once, every workload at zero.
    assert send(reporter, failed=True, outcome="Failed", targetReached=False,
                message="PermanentRunError: spec.task.reward: 'nope:f' cannot be imported")
    r = wait_for("Failed", lambda: (x := rlrun(kube, "oops", ns))["status"].get("phase") == C.PHASE_FAILED and x)
    f = cond(r, C.COND_FAILED)
    assert f["reason"] == "DriverFailed" and "'nope:f' cannot be imported" in f["message"]
    wait_for("workloads at zero", lambda: [w["spec"]["replicas"] for w in workloads(kube, "oops", ns)] == [0, 0])
    # The user fixes the spec: the run is retried.
    kube.patch("rlrun", "oops", ns, {"spec": {"task": {"reward": "exact-match"}}})
    try:
        r = wait_running(kube, "oops", ns)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{json.dumps(rlrun(kube, 'oops', ns).get('status'), indent=1)}\n"
                             f"{operator.log_tail()}") from None
    assert cond(r, C.COND_FAILED)["status"] == "False" and cond(r, C.COND_FAILED)["reason"] == "SpecChanged"
    assert "rlscale.dev/progress" not in (r["metadata"].get("annotations") or {})


def test_a_run_named_after_an_existing_object_takes_it_over_not(kube, operator, ns):
    """A ServiceAccount already named <run>-runner: the run is Failed (NameCollision), the account
    untouched; once it is deleted, the run starts."""
    account = B.names("taker")[C.ROLE_RUNNER]
    kube.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}}, ns)
    kube.apply(example_run("taker"), ns)
    failed = wait_for("Failed NameCollision", lambda: cond(rlrun(kube, "taker", ns), C.COND_FAILED).get("reason")
                      == "NameCollision" and cond(rlrun(kube, "taker", ns), C.COND_FAILED), 60)
    assert f"ServiceAccount {ns}/{account}" in failed["message"]
    sa = kube.get("serviceaccount", account, ns)
    assert not sa["metadata"].get("ownerReferences") and C.LABEL_RUN not in (sa["metadata"].get("labels") or {})
    assert kube.get("configmap", B.names("taker")[C.ROLE_CONFIG], ns) is None
    kube.run("delete", "serviceaccount", account, "-n", ns)
    wait_running(kube, "taker", ns)


def test_a_namespace_without_pod_security_gets_no_run(kube, operator, ns):
    kube.run("label", "namespace", ns, "pod-security.kubernetes.io/enforce-")
    kube.apply(example_run("loose"), ns)
    failed = wait_for("Failed NamespaceNotEnforced", lambda: cond(rlrun(kube, "loose", ns), C.COND_FAILED).get(
        "reason") == "NamespaceNotEnforced" and cond(rlrun(kube, "loose", ns), C.COND_FAILED), 60)
    assert f"kubectl label namespace {ns}" in failed["message"]
    assert kube.get("configmap", B.names("loose")[C.ROLE_CONFIG], ns) is None
    kube.run("label", "namespace", ns, "pod-security.kubernetes.io/enforce=baseline")
    wait_running(kube, "loose", ns)


def test_a_smaller_plan_removes_exactly_the_rollout_pods_the_driver_drained(kube, operator, ns, cluster):
    """Ordered scale-down with the real Deployment and ReplicaSet controllers: the Deployment keeps
    every rollout pod until the driver reports it has drained Serve to the new count, then the pods
    that host no replica, and only those, are deleted."""
    kube.apply(example_run("order"), ns)
    r = wait_running(kube, "order", ns)
    plan0 = Plan.from_dict(r["status"]["plan"])
    pods = sorted(p["metadata"]["name"] for p in running_pods(kube, "order", ns, C.ROLE_ROLLOUT))
    assert len(pods) == plan0.rollout_replicas
    reporter = reporter_for(kube, cluster, "order", ns)
    serving = {"rolloutTarget": plan0.rollout_replicas, "rolloutServing": plan0.rollout_replicas,
               "rolloutPods": pods}
    for step in (25, 50):  # generation faster, training slower than predicted: fewer replicas win
        assert send(reporter, step=step, samples=step * plan0.batch, samplesPerSecond=20.0,
                    measurements=measured(plan0, step, generate=0.3, train=3, noise=512.0), **serving)
        if step == 25:
            wait_for("first re-plan", lambda: (rlrun(kube, "order", ns)["status"].get("replan") or {}).get("count"))
    r = wait_for("re-plan", lambda: (x := rlrun(kube, "order", ns))
                 and cond(x, C.COND_PLANNED).get("reason") == "PlannedReplan" and x)
    n = Plan.from_dict(r["status"]["plan"]).rollout_replicas
    assert n < plan0.rollout_replicas
    wait_for("the ConfigMap's plan", lambda: configmap_plan(kube, "order", ns).rollout_replicas == n)
    # The driver has not drained yet: a few progress passes later every pod is still there.
    time.sleep(4)
    assert workloads(kube, "order", ns)[0]["spec"]["replicas"] == plan0.rollout_replicas
    assert len(running_pods(kube, "order", ns, C.ROLE_ROLLOUT)) == plan0.rollout_replicas
    # Drained to n: the replicas left run on every other pod (not the ones the ReplicaSet would pick).
    keep = (pods[1::2] + pods[0::2])[:n]
    assert send(reporter, step=50, samples=50 * plan0.batch, rolloutTarget=n, rolloutServing=n, rolloutPods=keep)
    wait_for("rollout replicas", lambda: workloads(kube, "order", ns)[0]["spec"]["replicas"] == n)
    left = wait_for("the drained pods gone", lambda: (x := sorted(
        p["metadata"]["name"] for p in running_pods(kube, "order", ns, C.ROLE_ROLLOUT))) and len(x) == n and x, 60)
    assert left == sorted(keep)
