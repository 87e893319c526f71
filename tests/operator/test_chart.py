"""The Helm chart, rendered by the helm built from Go modules (no cluster needed)."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from clusterkit import K8S_VERSION, OPERATOR_NS, OPERATOR_SA, REPO, chart_objects, cp

pytestmark = pytest.mark.cluster  # needs `make k8s` for helm

HELM = cp.bin_dir() / "helm"
CHART = REPO / "charts" / "rlscale"


def helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=60)


def test_chart_lints_clean():
    out = helm("lint", "--strict", "--kube-version", K8S_VERSION, str(CHART))
    assert out.returncode == 0, out.stdout + out.stderr


def test_default_render_has_operator_rbac_and_dashboard():
    objs = chart_objects(HELM)
    kinds = sorted(o["kind"] for o in objs)
    # The operator's ClusterRole and the two aggregated into the built-in edit and view roles; the Pod is
    # `helm test`'s (a hook: `helm install` leaves it to `helm test`); the admission policies that hold the
    # operator's and the runners' accounts to what they manage (admissionPolicy.enabled, on by default).
    assert kinds == ["ClusterRole"] * 3 + ["ClusterRoleBinding", "ConfigMap", "Deployment", "Pod",
                                           "PodDisruptionBudget", "Role", "RoleBinding", "Service", "ServiceAccount"] \
        + ["ValidatingAdmissionPolicy"] * 2 + ["ValidatingAdmissionPolicyBinding"] * 2
    dep = next(o for o in objs if o["kind"] == "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][0] == "operator"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["RLSCALE_CHECKPOINT_STORAGE"] == "50Gi"
    assert dep["metadata"]["namespace"] == OPERATOR_NS
    assert env["RLSCALE_NETWORK_POLICY"] == "true" and env["RLSCALE_METRICS_FROM"] == "monitoring"
    # Deny by default: the chart's own registry for images, nothing else of the policy.
    assert env["RLSCALE_REQUIRE_POD_SECURITY"] == "true" and env["RLSCALE_IMAGE_PREFIXES"] == "ghcr.io/rlscale"
    assert all(env[name] == "" for name in ("RLSCALE_RUNTIME_CLASS_NAMES", "RLSCALE_PRIORITY_CLASS_NAMES",
                                            "RLSCALE_SCHEDULER_NAMES", "RLSCALE_TOLERATION_KEYS",
                                            "RLSCALE_NODE_LABEL_KEYS", "RLSCALE_SECRET_NAMES", "RLSCALE_CLAIM_NAMES"))
    # Least privilege: secrets only created (each run's Ray token), never read; no delete.
    rules = next(o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"] == OPERATOR_SA)["rules"]
    verbs = {v for r in rules for v in r["verbs"]}
    assert "delete" not in verbs and "*" not in verbs
    assert [r["verbs"] for r in rules if "secrets" in r["resources"]] == [["create"]]
    assert any("rlruns/finalizers" in r["resources"] and r["verbs"] == ["update"] for r in rules)
    # The run's namespace is read for its Pod Security label, nothing else of it.
    assert [r["verbs"] for r in rules if "namespaces" in r["resources"]] == [["get"]]
    # Pods are read, and patched for their deletion cost (ordered scale-down), never deleted.
    assert [r["verbs"] for r in rules if "pods" in r["resources"]] == [["get", "list", "watch", "patch"]]
    dash = next(o for o in objs if o["kind"] == "ConfigMap")
    assert '"uid": "rlscale-runs"' in dash["data"]["rlscale.json"]


def test_two_replicas_elect_a_leader_over_the_releases_lease():
    objs = chart_objects(HELM)
    dep = next(o for o in objs if o["kind"] == "Deployment")
    spec = dep["spec"]["template"]["spec"]
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert dep["spec"]["replicas"] == 2 and "strategy" not in dep["spec"]  # rolling: the new pod stands by
    assert env["RLSCALE_OPERATOR_LEASE"]["value"] == f"{OPERATOR_NS}/rlscale-operator-leader"
    assert env["RLSCALE_OPERATOR_LEASE_SECONDS"]["value"] == "15"
    assert env["RLSCALE_OPERATOR_IDENTITY"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    anti = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["podAffinityTerm"]["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    pdb = next(o for o in objs if o["kind"] == "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": dep["spec"]["selector"]}
    # The Lease is the only thing the replicas may touch in the release's namespace, by name.
    role = next(o for o in objs if o["kind"] == "Role")
    assert role["metadata"]["namespace"] == OPERATOR_NS
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["rlscale-operator-leader"],
         "verbs": ["get", "patch"]}]
    # One replica: no budget, no anti-affinity; an affinity of the user's replaces ours.
    one = chart_objects(HELM, "--set", "operator.replicas=1")
    assert not [o for o in one if o["kind"] == "PodDisruptionBudget"]
    dep1 = next(o for o in one if o["kind"] == "Deployment")
    assert dep1["spec"]["replicas"] == 1 and "affinity" not in dep1["spec"]["template"]["spec"]
    out = helm("template", "x", str(CHART), "--kube-version", K8S_VERSION, "--set", "operator.replicas=0")
    assert out.returncode != 0 and "replicas" in out.stderr


def test_namespaced_install_uses_roles_in_each_namespace():
    objs = chart_objects(HELM, "--set", "operator.watchNamespaces={team-a,team-b}")
    # Cluster-wide: only the roles aggregated into edit and view, which grant nothing by themselves.
    assert [o["metadata"]["name"] for o in objs if o["kind"].startswith("Cluster")] == \
        [f"{OPERATOR_SA}-rlrun-edit", f"{OPERATOR_SA}-rlrun-view"]
    roles = [o for o in objs if o["kind"] == "Role"]
    # ... and one in `default`: the API server's EndpointSlice, which the runs' egress policy allows.
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["default", OPERATOR_NS, "team-a", "team-b"]
    (in_default,) = [r for r in roles if r["metadata"]["namespace"] == "default"]
    assert [(r["resources"], r["verbs"]) for r in in_default["rules"]] == [(["endpointslices"], ["get"])], in_default
    dep = next(o for o in objs if o["kind"] == "Deployment")
    assert "--namespace=team-a" in dep["spec"]["template"]["spec"]["containers"][0]["args"]


def test_values_schema_refuses_bad_values_naming_them():
    out = helm("template", "x", str(CHART), "--kube-version", K8S_VERSION, "--set", "checkpointStorage=lots")
    assert out.returncode != 0 and "checkpointStorage" in out.stderr
    out = helm("template", "x", str(CHART), "--kube-version", K8S_VERSION, "--set", "operator.imagez=1")
    assert out.returncode != 0 and "imagez" in out.stderr


def test_placement_profiles_reach_the_operator_as_it_reads_them(tmp_path):
    from rlscale.operator.settings import OperatorSettings

    values = tmp_path / "profiles.yaml"
    values.write_text("policy:\n  requirePlacementProfile: true\n  placementProfiles:\n    h100:\n"
                      "      nodeSelector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}\n"
                      "      tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]\n"
                      "      queueName: h100\n    cpu: {nodeSelector: {pool: cpu}}\n")
    dep = next(o for o in chart_objects(HELM, "-f", str(values)) if o["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    policy = OperatorSettings.from_env(env).policy
    assert [p.name for p in policy.placement_profiles] == ["cpu", "h100"] and policy.require_placement_profile
    h100 = policy.placement_profiles[1]
    assert h100.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"} and h100.queue_name == "h100"
    assert h100.tolerations == ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)
    # None by default; a field a profile does not take is refused by the chart's schema, naming it.
    default = next(o for o in chart_objects(HELM) if o["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in default["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RLSCALE_PLACEMENT_PROFILES"] == "{}" and env["RLSCALE_REQUIRE_PLACEMENT_PROFILE"] == "false"
    out = helm("template", "x", str(CHART), "--kube-version", K8S_VERSION,
               "--set", "policy.placementProfiles.h100.nodeSelectr.pool=a")
    assert out.returncode != 0 and "nodeSelectr" in out.stderr, out.stderr


def test_chart_crd_is_the_generated_one():
    from rlscale.crd import crd_yaml

    committed = yaml.safe_load((CHART / "crds" / "rlruns.rlscale.dev.yaml").read_text())
    assert committed == yaml.safe_load(crd_yaml())


def test_monitors_carry_the_labels_a_prometheus_selects_by():
    objs = chart_objects(HELM, "--api-versions", "monitoring.coreos.com/v1",
                         "--set", "metrics.podMonitor.additionalLabels.release=kps",
                         "--set", "metrics.serviceMonitor.additionalLabels.release=kps",
                         "--set", "networkPolicy.metricsNamespaces={obs,prom}")
    monitors = {o["kind"]: o for o in objs if o["kind"] in ("PodMonitor", "ServiceMonitor")}
    assert set(monitors) == {"PodMonitor", "ServiceMonitor"}
    assert monitors["ServiceMonitor"]["spec"]["endpoints"][0]["honorLabels"] is True
    for m in monitors.values():
        assert m["metadata"]["labels"]["release"] == "kps"
        assert m["metadata"]["labels"]["app.kubernetes.io/name"] == "rlscale"
    dep = next(o for o in objs if o["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RLSCALE_METRICS_FROM"] == "obs,prom"


def test_policy_values_reach_the_operator_env():
    objs = chart_objects(HELM, "--set", "policy.imagePrefixes={reg.example/ml/,ghcr.io/rlscale/}",
                         "--set", "policy.runtimeClassNames={nvidia}", "--set", "policy.priorityClassNames={high,low}",
                         "--set", "policy.requirePodSecurity=false")
    dep = next(o for o in objs if o["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RLSCALE_IMAGE_PREFIXES"] == "reg.example/ml/,ghcr.io/rlscale/"
    assert env["RLSCALE_RUNTIME_CLASS_NAMES"] == "nvidia" and env["RLSCALE_PRIORITY_CLASS_NAMES"] == "high,low"
    assert env["RLSCALE_REQUIRE_POD_SECURITY"] == "false"


# --------------------------------------------------------------------------- notes, roles, alerts, knobs

PROMTOOL = cp.cache_root() / "prometheus" / "promtool"
JOB = f'job="{OPERATOR_SA}-metrics"'  # the ServiceMonitor's job: the metrics Service's name


def rendered_notes(tmp_path, *set_args: str) -> str:
    """NOTES.txt as `helm install` prints it: `helm template` leaves NOTES out, so a copy of the chart renders
    the same file through tpl in a template of its own."""
    import shutil

    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    shutil.copy(CHART / "templates" / "NOTES.txt", chart / "notes.txt")
    (chart / "templates" / "zz-notes.yaml").write_text('kind: Notes\ntext: {{ tpl (.Files.Get "notes.txt") . '
                                                         '| toJson }}\n')
    out = subprocess.run([str(HELM), "template", "rlscale", str(chart), "--namespace", OPERATOR_NS,
                          "--kube-version", K8S_VERSION, "--show-only", "templates/zz-notes.yaml", *set_args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)["text"]


def test_notes_say_what_to_do_next(tmp_path):
    text = rendered_notes(tmp_path)
    assert f"kubectl -n {OPERATOR_NS} rollout status deployment/{OPERATOR_SA}" in text
    assert "pod-security.kubernetes.io/enforce=restricted" in text  # policy.requirePodSecurity's default
    assert "Prometheus Operator's CRDs (monitoring.coreos.com/v1)" in text and "helm test rlscale" in text
    scoped = rendered_notes(tmp_path / "b", "--api-versions", "monitoring.coreos.com/v1", "--set",
                            "operator.watchNamespaces={team-a}", "--set", "metrics.prometheusRule.enabled=true")
    assert "kubectl -n team-a get rlrun -w" in scoped and f"alerts PrometheusRule {OPERATOR_SA}" in scoped
    assert "additionalLabels.release" in scoped  # kube-prometheus-stack selects by it; none is set


def test_edit_and_view_gain_rlruns_by_aggregation():
    roles = {o["metadata"]["name"]: o for o in chart_objects(HELM) if o["kind"] == "ClusterRole"}
    edit, view = roles[f"{OPERATOR_SA}-rlrun-edit"], roles[f"{OPERATOR_SA}-rlrun-view"]
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert {"create", "delete", "patch", "update"} <= set(edit["rules"][0]["verbs"])
    assert edit["rules"][0] == {**edit["rules"][0], "apiGroups": ["rlscale.dev"], "resources": ["rlruns"]}
    assert not [r for r in edit["rules"] if "rlruns/status" in r["resources"] and set(r["verbs"]) - {"get"}]
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert {v for r in view["rules"] for v in r["verbs"]} == {"get", "list", "watch"}
    off = chart_objects(HELM, "--set", "rbac.aggregateToDefaultRoles=false")
    assert [o["metadata"]["name"] for o in off if o["kind"] == "ClusterRole"] == [OPERATOR_SA]


def test_pod_monitor_scrapes_every_run_metrics_port():
    objs = chart_objects(HELM, "--api-versions", "monitoring.coreos.com/v1")
    pm = next(o for o in objs if o["kind"] == "PodMonitor")
    assert [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] == ["metrics", "rollout-metrics"]
    assert not [o for o in objs if o["kind"] == "PrometheusRule"]  # opt in


def rules_of(*set_args: str) -> dict:
    objs = chart_objects(HELM, "--api-versions", "monitoring.coreos.com/v1", "--set",
                         "metrics.prometheusRule.enabled=true", *set_args)
    (rule,) = [o for o in objs if o["kind"] == "PrometheusRule"]
    return rule


def test_prometheus_rule_carries_the_selected_labels_and_passes_promtool(tmp_path):
    rule = rules_of("--set", "metrics.prometheusRule.additionalLabels.release=kps",
                    "--set", "metrics.prometheusRule.alertLabels.team=ml")
    assert rule["metadata"]["labels"]["release"] == "kps"
    alerts = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"]}
    assert set(alerts) == {"RLScaleOperatorNoLeader", "RLScaleOperatorReconcileErrors", "RLRunWithoutSteps",
                           "RLRunReplicasNotReady", "RLRunFailed"}
    assert all(r["labels"]["team"] == "ml" for r in alerts.values())
    f = tmp_path / "rules.yaml"
    f.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    out = subprocess.run([str(PROMTOOL), "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def series(name: str, labels: dict[str, str], values: str) -> dict:
    inner = ", ".join([JOB] + [f'{k}="{v}"' for k, v in labels.items()])
    return {"series": f"{name}{{{inner}}}", "values": values}


def leader(instance: str, values: str) -> dict:
    return series("rlscale_operator_leader", {"instance": instance}, values)


def run_series(name: str, instance: str, values: str, **labels: str) -> dict:
    return series(name, {"instance": instance, "namespace": "team-a", "run": "r", **labels}, values)


def alert_cases() -> list[tuple[str, str, list[dict], int, list[dict]]]:
    """(name, alert, input series, minute to evaluate at, the alerts' labels expected then), one scenario
    that fires each alert and one that must not. Instance b is a replica that stepped down: its per-run
    series keep their last values and must not count."""
    run = {"namespace": "team-a", "run": "r", "severity": "warning"}
    return [
        ("no replica leads", "RLScaleOperatorNoLeader", [leader("a", "0x20"), leader("b", "0x20")], 10,
         [{"severity": "critical"}]),
        ("one replica leads", "RLScaleOperatorNoLeader", [leader("a", "1x20"), leader("b", "0x20")], 10, []),
        ("no operator at all", "RLScaleOperatorNoLeader", [series("up", {}, "1x20")], 10,
         [{"severity": "critical", "job": f"{OPERATOR_SA}-metrics"}]),  # absent() keeps the selector's label
        ("errors for 20 minutes", "RLScaleOperatorReconcileErrors",
         [series("rlscale_operator_reconcile_errors_total", {"instance": "a", "kind": "ApiException"}, "0+1x40")],
         25, [{"kind": "ApiException", "severity": "warning"}]),
        ("one error long ago", "RLScaleOperatorReconcileErrors",
         [series("rlscale_operator_reconcile_errors_total", {"instance": "a", "kind": "ApiException"}, "0 1x40")],
         25, []),
        ("running 40 minutes, no step", "RLRunWithoutSteps",
         [leader("a", "1x60"), run_series("rlscale_operator_run_phase", "a", "1x60", phase="Running"),
          run_series("rlscale_operator_run_last_progress_timestamp_seconds", "a", "0x60")], 40,
         [{**run, "instance": "a", "phase": "Running", "job": f"{OPERATOR_SA}-metrics"}]),
        ("a step every minute; a stale replica's old clock", "RLRunWithoutSteps",
         [leader("a", "1x60"), leader("b", "0x60"),
          run_series("rlscale_operator_run_phase", "a", "1x60", phase="Running"),
          run_series("rlscale_operator_run_last_progress_timestamp_seconds", "a", "0+60x60"),
          run_series("rlscale_operator_run_phase", "b", "1x60", phase="Running"),
          run_series("rlscale_operator_run_last_progress_timestamp_seconds", "b", "0x60")], 40, []),
        ("one learner of two ready", "RLRunReplicasNotReady",
         [leader("a", "1x40"), run_series("rlscale_operator_replicas", "a", "2x40", role="learner", state="desired"),
          run_series("rlscale_operator_replicas", "a", "1x40", role="learner", state="ready")], 20,
         [{**run, "instance": "a", "role": "learner", "job": f"{OPERATOR_SA}-metrics"}]),
        ("all ready", "RLRunReplicasNotReady",
         [leader("a", "1x40"), run_series("rlscale_operator_replicas", "a", "2x40", role="learner", state="desired"),
          run_series("rlscale_operator_replicas", "a", "2x40", role="learner", state="ready")], 20, []),
        ("a failed run", "RLRunFailed",
         [leader("a", "1x10"), run_series("rlscale_operator_run_phase", "a", "1x10", phase="Failed")], 5,
         [{**run, "instance": "a", "phase": "Failed", "job": f"{OPERATOR_SA}-metrics"}]),
        ("failed only on the replica that stepped down", "RLRunFailed",
         [leader("a", "1x10"), leader("b", "0x10"),
          run_series("rlscale_operator_run_phase", "a", "0x10", phase="Failed"),
          run_series("rlscale_operator_run_phase", "b", "1x10", phase="Failed")], 5, []),
    ]


@pytest.mark.parametrize("case", alert_cases(), ids=lambda c: c[0])
def test_each_alert_fires_in_its_scenario_and_only_there(tmp_path, case):
    """promtool evaluates the rendered rules over series built for each alert (promtool test rules)."""
    _, alert, inputs, minute, expected = case
    rule = rules_of()
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    annotations = {r["alert"]: r["annotations"] for r in rule["spec"]["groups"][0]["rules"]}
    exp = [{"exp_labels": labels, "exp_annotations": expand(annotations[alert], labels)} for labels in expected]
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": inputs,
                       "alert_rule_test": [{"eval_time": f"{minute}m", "alertname": alert, "exp_alerts": exp}]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    out = subprocess.run([str(PROMTOOL), "test", "rules", "test.yaml"], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def expand(annotations: dict[str, str], labels: dict[str, str]) -> dict[str, str]:
    """The annotations as Prometheus fills them in for these labels (the alerts' templates use $labels only,
    but for the error rate's value, which the error scenario makes 1/60 per second)."""
    out = {}
    for k, text in annotations.items():
        for name, value in labels.items():
            text = text.replace(f"{{{{ $labels.{name} }}}}", value)
        out[k] = text.replace("{{ $value | humanize }}", "16.67m")
    return out


def test_common_knobs_reach_the_operator_pod():
    objs = chart_objects(HELM, "--set", "global.imageRegistry=reg.example", "--set", "fullnameOverride=rl-op",
                         "--set", "operator.imagePullSecrets[0].name=regcred", "--set", "operator.podLabels.team=ml",
                         "--set", "operator.podAnnotations.note=x", "--set", "operator.securityContext.runAsGroup=7")
    dep = next(o for o in objs if o["kind"] == "Deployment")
    pod = dep["spec"]["template"]
    assert dep["metadata"]["name"] == "rl-op" and pod["metadata"]["labels"]["team"] == "ml"
    assert pod["metadata"]["annotations"] == {"note": "x"}
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    c = pod["spec"]["containers"][0]
    assert c["securityContext"]["runAsGroup"] == 7 and c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["RLSCALE_OPERATOR_LEASE"] == f"{OPERATOR_NS}/rl-op-leader"
    named = chart_objects(HELM, "--set", "nameOverride=trainer")
    assert next(o for o in named if o["kind"] == "Deployment")["metadata"]["name"] == "rlscale-trainer"
    out = helm("template", "x", str(CHART), "--kube-version", K8S_VERSION, "--set", "fullnameOverride=Bad_Name")
    assert out.returncode != 0 and "fullnameOverride" in out.stderr


def test_helm_test_asks_the_metrics_service_for_a_leader():
    out = helm("template", "rlscale", str(CHART), "--namespace", OPERATOR_NS, "--kube-version", K8S_VERSION,
               "--show-only", "templates/tests/operator-metrics.yaml")
    assert out.returncode == 0, out.stderr
    pod = yaml.safe_load(out.stdout)
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = pod["spec"]["containers"][0]["args"][0]
    assert f"http://{OPERATOR_SA}-metrics.{OPERATOR_NS}.svc:8080/metrics" in script
    compile(script, "helm-test", "exec")  # the script the pod runs is Python that parses


# A spec's length defaults depend on task.dataset, so the CRD gives them no default and its rules compute them
# in CEL as the Python rules do: (spec, the message the API server refuses it with, or None: admitted).
DATASET = "/models/data/q.jsonl"
QWEN = {"path": "Qwen/Qwen2.5-0.5B-Instruct"}
DEFAULTED = [
    ({"model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"}, "task": {"dataset": DATASET, "reward": "exact-match"}}, None),
    ({"hardware": {"accelerator": "cpu"}}, None),
    ({"model": {"path": "Qwen/Qwen2.5-0.5B-Instruct", "maxLength": 200}, "task": {"dataset": DATASET}},
     "task.maxNewTokens must be smaller than model.maxLength"),
    ({"hardware": {"accelerator": "cpu"}, "model": {"maxLength": 20}},
     "model.maxLength must hold task.expectedPromptTokens + task.maxNewTokens"),
    ({"hardware": {"accelerator": "cpu"}, "task": {"expectedResponseTokens": 9}},
     "task.expectedResponseTokens must be <= task.maxNewTokens"),
    ({"model": QWEN, "task": {"dataset": DATASET}, "batch": {"microBatchTokens": 768}}, None),
    ({"model": QWEN, "task": {"dataset": DATASET}, "batch": {"microBatchTokens": 700}},
     "batch.microBatchTokens must hold one sequence"),
]


@pytest.mark.parametrize("spec,message", DEFAULTED, ids=[m or "admitted" for _, m in DEFAULTED])
def test_the_crd_rules_see_the_defaults_the_spec_fills_in(kube, ns, spec, message):
    from rlscale.spec import SpecError, parse_spec

    try:
        parse_spec(spec)
        python_refuses = False
    except SpecError:
        python_refuses = True
    assert python_refuses == (message is not None)  # the CEL and the Python rules agree
    obj = {"apiVersion": "rlscale.dev/v1alpha1", "kind": "RLRun", "metadata": {"name": "defaults"}, "spec": spec}
    out = kube.apply(obj, ns, check=False)
    if message is None:
        assert out.returncode == 0, out.stderr
    else:
        assert out.returncode != 0 and message in out.stderr, out.stderr
