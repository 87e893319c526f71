"""The chart's high availability and namespaced mode on the real control plane: two operator
processes electing a leader over the chart's Lease with the chart's RBAC, the leader killed; and
an operator installed for one namespace with Roles only."""

from __future__ import annotations

import re
import signal
import sys
import time

import pytest
from clusterkit import OPERATOR_NS, Operator, chart_objects, cp, example_run, wait_for

from rlscale.operator import constants as C

pytestmark = pytest.mark.cluster

LEASE = "rlscale-operator-leader"  # the chart's Lease for release "rlscale" (its Role names it)
LEASE_S = 6  # short, so the test waits little; the chart's default is 15
KINDS = ("configmap", "service", "deployment", "statefulset", "serviceaccount", "role", "rolebinding",
         "networkpolicy", "secret", "poddisruptionbudget")


def holder(kube) -> str:
    lease = kube.get("lease", LEASE, OPERATOR_NS) or {}
    return (lease.get("spec") or {}).get("holderIdentity") or ""


def children(kube, ns, run):
    """Every child of the run by kind: {kind: sorted (name, uid)}."""
    return {k: sorted((o["metadata"]["name"], o["metadata"]["uid"])
                      for o in kube.get(k, ns=ns, selector=f"{C.LABEL_RUN}={run}")["items"]) for k in KINDS}


def phase(kube, ns, run):
    return ((kube.get("rlrun", run, ns) or {}).get("status") or {}).get("phase")


def leader_gauge(op: Operator) -> float:
    m = re.search(r"^rlscale_operator_leader (\S+)$", op.metrics(), re.M)
    return float(m.group(1)) if m else -1.0


def reconciles(op: Operator) -> float:
    return sum(float(v) for v in re.findall(r"^rlscale_operator_reconciles_total\{[^}]*\} (\S+)$", op.metrics(), re.M))


def test_killing_the_leader_hands_over_within_seconds_with_no_duplicate_children(
        kube, operator, operator_kubeconfig, ns, tmp_path):
    operator.kill()  # the session's operator runs without election; these two replace it
    env = {"RLSCALE_OPERATOR_LEASE": f"{OPERATOR_NS}/{LEASE}", "RLSCALE_OPERATOR_LEASE_SECONDS": str(LEASE_S)}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = Operator(operator_kubeconfig, tmp_path / "a"), Operator(operator_kubeconfig, tmp_path / "b")
    try:
        a.start("--namespace", ns, RLSCALE_OPERATOR_IDENTITY="a", **env)
        # A Lease left by an earlier holder expires first (one lease duration); then a takes it.
        wait_for("a holds the lease", lambda: holder(kube) == "a", 3 * LEASE_S + 10)
        b.start("--namespace", ns, RLSCALE_OPERATOR_IDENTITY="b", **env)
        kube.apply(example_run("ha"), ns)
        wait_for("run Running", lambda: phase(kube, ns, "ha") == C.PHASE_RUNNING, 60)
        assert (leader_gauge(a), leader_gauge(b)) == (1.0, 0.0)
        assert reconciles(b) == 0  # the standby has not touched a run
        before = children(kube, ns, "ha")
        assert all(before[k] for k in ("configmap", "deployment", "statefulset")), before
        transitions = kube.get("lease", LEASE, OPERATOR_NS)["spec"].get("leaseTransitions", 0)

        a.kill(signal.SIGKILL)  # no release: b must wait the lease out
        t0 = time.monotonic()
        wait_for("b takes the lease", lambda: holder(kube) == "b", 3 * LEASE_S)
        handover = time.monotonic() - t0
        print(f"\nleader killed (SIGKILL): b took the lease after {handover:.1f}s "
              f"(lease {LEASE_S}s, retry {LEASE_S / 7.5:.1f}s)", file=sys.stderr)
        assert handover <= LEASE_S + 2 * LEASE_S / 7.5 + 3
        assert kube.get("lease", LEASE, OPERATOR_NS)["spec"]["leaseTransitions"] == transitions + 1
        wait_for("b's leader gauge", lambda: leader_gauge(b) == 1.0, 10)

        # The new leader reconciles: a spec change reaches the workloads...
        kube.patch("rlrun", "ha", ns, {"spec": {"rollout": {"replicas": 1}}})
        n = f"ha-{C.ROLE_ROLLOUT}"
        wait_for("b scaled the rollout", lambda: kube.get("deployment", n, ns)["spec"]["replicas"] == 1, 60)
        # ... and the children are the same objects: none created twice, none replaced.
        assert children(kube, ns, "ha") == before

        # A clean stop releases the lease: a (back as a standby) takes it at its next round.
        a.start("--namespace", ns, RLSCALE_OPERATOR_IDENTITY="a", **env)
        time.sleep(1)
        assert holder(kube) == "b" and leader_gauge(a) == 0.0
        b.kill(signal.SIGTERM)
        t0 = time.monotonic()
        wait_for("a takes the released lease", lambda: holder(kube) == "a", LEASE_S)
        print(f"leader stopped (SIGTERM): a took the lease after {time.monotonic() - t0:.1f}s", file=sys.stderr)
        assert children(kube, ns, "ha") == before
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- a:\n{a.log_tail()}\n--- b:\n{b.log_tail()}") from None
    finally:
        a.kill(signal.SIGTERM)
        b.kill(signal.SIGTERM)
        operator.start()


def test_a_namespaced_install_reconciles_its_namespace_with_roles_only(kube, cluster, operator, ns, tmp_path):
    release = "team"
    objs = chart_objects(cp.bin_dir() / "helm", "--set", f"operator.watchNamespaces={{{ns}}}", release=release)
    rbac = [o for o in objs if o["kind"] in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole",
                                             "ClusterRoleBinding")]
    # Cluster-wide only the roles aggregated into edit and view (rbac.aggregateToDefaultRoles), which grant nothing
    # by themselves; the operator's own rights are Roles.
    assert [o["metadata"]["name"] for o in rbac if o["kind"].startswith("Cluster")] == \
        [f"{release}-operator-rlrun-edit", f"{release}-operator-rlrun-view"]
    kube.apply({"apiVersion": "v1", "kind": "List", "items": rbac})
    sa = f"{release}-operator"
    token = kube.run("create", "token", sa, "-n", OPERATOR_NS, "--duration=1h").stdout.strip()
    kubeconfig = cp.write_kubeconfig(tmp_path / "team.kubeconfig", cluster.server, cluster.dir / "pki" / "ca.crt",
                                     token=token)
    user = f"system:serviceaccount:{OPERATOR_NS}:{sa}"

    def can(*args):
        return kube.run("auth", "can-i", *args, f"--as={user}", check=False).stdout.strip()
    assert can("create", "statefulsets", "-n", ns) == "yes"
    assert can("create", "statefulsets", "-n", "default") == "no"
    assert can("list", "rlruns", "--all-namespaces") == "no"
    assert can("patch", f"leases/{release}-operator-leader", "-n", OPERATOR_NS) == "yes"
    assert can("patch", "leases/kube-scheduler", "-n", "kube-system") == "no"

    operator.kill()
    team = Operator(kubeconfig, tmp_path)
    try:
        team.start("--namespace", ns, RLSCALE_OPERATOR_LEASE=f"{OPERATOR_NS}/{release}-operator-leader",
                   RLSCALE_OPERATOR_IDENTITY="team-0", RLSCALE_OPERATOR_LEASE_SECONDS=str(LEASE_S))
        kube.apply(example_run("scoped"), ns)
        wait_for("run Running", lambda: phase(kube, ns, "scoped") == C.PHASE_RUNNING, 60)
        log = team.log_tail(100000)
        refused = [line for line in log.splitlines() if f'User \\"{user}\\" cannot' in line
                   or f'User "{user}" cannot' in line]
        assert not refused, "\n".join(refused[:5])
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- operator:\n{team.log_tail()}") from None
    finally:
        team.kill(signal.SIGTERM)
        operator.start()
