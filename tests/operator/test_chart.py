"""The Helm chart, rendered by the helm built from Go modules (no cluster needed)."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from clusterkit import K8S_VERSION, OPERATOR_NS, REPO, chart_objects, cp

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
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "PodDisruptionBudget", "Role",
                     "RoleBinding", "Service", "ServiceAccount"]
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
    rules = next(o for o in objs if o["kind"] == "ClusterRole")["rules"]
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
    assert not [o for o in objs if o["kind"].startswith("Cluster")]
    roles = [o for o in objs if o["kind"] == "Role"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == [OPERATOR_NS, "team-a", "team-b"]
    dep = next(o for o in objs if o["kind"] == "Deployment")
    assert "--namespace=team-a" in dep["spec"]["template"]["spec"]["containers"][0]["args"]


def test_values_schema_refuses_bad_values_naming_them():
    out = helm("template", "x", str(CHART), "--kube-version", K8S_VERSION, "--set", "checkpointStorage=lots")
    assert out.returncode != 0 and "checkpointStorage" in out.stderr
    out = helm("template", "x", str(CHART), "--kube-version", K8S_VERSION, "--set", "operator.imagez=1")
    assert out.returncode != 0 and "imagez" in out.stderr


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
