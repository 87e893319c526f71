"""The product's main path on the real node: `helm install` the chart (the operator image built
here), `kubectl apply -f examples/quickstart-k8s.yaml`, and the operator's own pods train the
quickstart to its target; a real Prometheus finds the pods through the API server the way the
chart's PodMonitor and ServiceMonitor ask, and every panel of the Grafana dashboard has data."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from hack import cluster as cp
from hack.cluster import quickstart as qs
from rlscale.operator import builders as B
from rlscale.operator import constants as C
from tests.e2e.conftest import prometheus_binary
from tests.node.runs import wait

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(3000)]

REPO = Path(__file__).resolve().parents[2]


OPERATOR_NS = qs.OPERATOR_NS
RUN = "quickstart"
NS = "quickstart-e2e"
# The run's namespace enforces the `restricted` Pod Security profile: a pod of the run that
# asked for more (root, a capability, a writable root filesystem...) would be refused.
PSS = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"}



class DiscoveringPrometheus:
    """Prometheus on loopback that discovers targets from the API server (kubernetes_sd), with
    the relabelling the chart's PodMonitor (run pods) and ServiceMonitor (operator) ask for."""

    def __init__(self, workdir: Path, cluster, run_ns: str):
        from rlscale.roles import free_port

        self.port = free_port()
        pki = cluster.dir / "pki"
        sd = {"api_server": cluster.server,
              "tls_config": {"ca_file": str(pki / "ca.crt"), "cert_file": str(pki / "admin.crt"),
                             "key_file": str(pki / "admin.key")}}
        keep_metrics_port = {"source_labels": ["__meta_kubernetes_pod_container_port_name"],
                             "regex": "metrics", "action": "keep"}
        cfg = {
            "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
            "scrape_configs": [
                {"job_name": "rlscale-runs",
                 "kubernetes_sd_configs": [{**sd, "role": "pod", "namespaces": {"names": [run_ns]}}],
                 "relabel_configs": [
                     {"source_labels": ["__meta_kubernetes_pod_label_rlscale_dev_run"], "regex": ".+",
                      "action": "keep"},
                     keep_metrics_port,
                     {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                     {"source_labels": ["__meta_kubernetes_pod_label_rlscale_dev_run"], "target_label": "run"},
                     {"source_labels": ["__meta_kubernetes_pod_label_rlscale_dev_role"], "target_label": "role"},
                     {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}]},
                {"job_name": "rlscale-operator", "honor_labels": True,
                 "kubernetes_sd_configs": [{**sd, "role": "endpoints", "namespaces": {"names": [OPERATOR_NS]}}],
                 "relabel_configs": [
                     {"source_labels": ["__meta_kubernetes_service_label_app_kubernetes_io_name"], "regex": "rlscale",
                      "action": "keep"},
                     {"source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": "metrics",
                      "action": "keep"}]},
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        self.proc = subprocess.Popen(
            [prometheus_binary(), f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=open(workdir / "prometheus.log", "wb"), stderr=subprocess.STDOUT)
        wait("prometheus ready", lambda: self._get("/-/ready") is not None, 60)

    def _get(self, path: str):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.read()
        except OSError:
            return None

    def query(self, expr: str) -> list[dict]:
        body = json.loads(self._get("/api/v1/query?" + urllib.parse.urlencode({"query": expr})) or b"{}")
        assert body.get("status") == "success", body
        return body["data"]["result"]

    def targets(self) -> list[dict]:
        return json.loads(self._get("/api/v1/targets") or b"{}").get("data", {}).get("activeTargets", [])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def dashboard_queries(run: str, namespace: str) -> list[tuple[str, str]]:
    """Each panel's query as Grafana sends it with this run chosen (namespace and name)."""
    dash = json.loads((REPO / "charts/rlscale/dashboards/rlscale.json").read_text())
    return [(p["title"], t["expr"].replace("$run", run).replace("$namespace", namespace))
            for p in dash["panels"] for t in p.get("targets", [])]


def test_kubectl_apply_trains_the_quickstart_to_its_target_on_the_operators_own_pods(node_cluster, images, tmp_path):
    c = node_cluster
    kubectl = c.kubectl

    def get(kind: str, name: str | None = None, ns: str = NS, selector: str | None = None):
        args = ["get", kind, *([name] if name else []), "-n", ns, "-o", "json", *(["-l", selector] if selector else [])]
        out = kubectl(*args, check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    qs.helm_install(cp.bin_dir() / "helm", c.kubeconfig)
    op = wait("the operator pod Ready", lambda: [
        p for p in get("pods", ns=OPERATOR_NS, selector="app.kubernetes.io/name=rlscale")["items"]
        if any(s.get("ready") for s in p["status"].get("containerStatuses", []))], 300)
    assert op[0]["spec"]["nodeName"] == c.node_name

    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": NS, "labels": PSS}}))
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                  "items": qs.claims(NS, qs.model_cache(), tmp_path / "checkpoints")}))
    prom = DiscoveringPrometheus(tmp_path, c, NS)
    try:
        t_apply = time.monotonic()
        kubectl("apply", "-n", NS, "-f", str(REPO / "examples/quickstart-k8s.yaml"))
        n = B.names(RUN)

        def rlrun():
            return get("rlrun", RUN) or {}

        def running(role: str):
            pods = get("pods", selector=f"{C.LABEL_RUN}={RUN},{C.LABEL_ROLE}={role}")["items"]
            return [p for p in pods if p["status"].get("phase") == "Running"]

        # The learner pod installs the model into the claim on a cold machine (the shipped build:
        # seconds; the recipe, where none ships, took 690 s in the pod on a 2-core machine beside
        # the run's other pods), then DeepSpeed and vLLM start.
        for role in (C.ROLE_RAY_HEAD, C.ROLE_ROLLOUT, C.ROLE_LEARNER):
            pods = wait(f"{role} pod Running", lambda r=role: running(r), 1500)
            assert pods[0]["spec"]["nodeName"] == c.node_name, "run pods land on the real node"
        first = wait("the first step in status",
                     lambda: (rlrun().get("status") or {}).get("progress", {}).get("step"), 900)
        t_first = time.monotonic() - t_apply
        steps_seen = {first}
        wait("steps progressing in status", lambda: steps_seen.add(
            (rlrun().get("status") or {}).get("progress", {}).get("step")) or len(steps_seen - {None}) >= 3, 300)

        # The target is reached and the run ends: Succeeded, every workload at zero.
        def ended():
            r = rlrun()
            conds = {x["type"]: x for x in (r.get("status") or {}).get("conditions", [])}
            done = any(conds.get(t, {}).get("status") == "True"
                       for t in (C.COND_SUCCEEDED, C.COND_BUDGET_EXHAUSTED, C.COND_INVALID))
            return (r, conds) if done or r.get("status", {}).get("phase") == C.PHASE_FAILED else None
        r, cond = wait("the run to end (the driver's last report)", ended, 1500, 3)
        st = r["status"]
        assert st["phase"] == C.PHASE_SUCCEEDED, json.dumps(st, indent=1)
        assert cond[C.COND_SUCCEEDED]["status"] == "True", cond
        print(f"\nSucceeded condition: {cond[C.COND_SUCCEEDED]['message']}", file=sys.stderr)
        for kind, name in (("deployment", n[C.ROLE_ROLLOUT]), ("statefulset", n[C.ROLE_LEARNER]),
                           ("deployment", n[C.ROLE_RAY_HEAD])):
            wait(f"{kind} {name} scaled to zero", lambda k=kind, nm=name: get(k, nm)["spec"]["replicas"] == 0, 120)
        wait("the run's pods gone", lambda: not get("pods", selector=f"{C.LABEL_RUN}={RUN}")["items"], 180)
        prog = st["progress"]
        assert prog["targetReached"] and prog["timeToTargetSeconds"] > 0 and prog["samplesToTarget"] > 0

        row = kubectl("get", "rlrun", RUN, "-n", NS).stdout.splitlines()[1].split()
        assert "Succeeded" in row and prog["timeToTarget"] in row

        # Every panel of the dashboard had data while the run trained (the run may end within
        # seconds of its first step, so each panel's query is looked back on over the run).
        def panels_missing():
            return [f"{title}: {expr}" for title, expr in dashboard_queries(RUN, NS)
                    if not prom.query(f"max_over_time(({expr})[30m:2s])")]
        missing = []

        def all_panels():
            missing[:] = panels_missing()
            return not missing
        try:
            wait("every dashboard panel query to return data", all_panels, 120, 3)
        except AssertionError:
            raise AssertionError(f"panels without data: {missing}\n"
                                 f"targets: {json.dumps(prom.targets())[:3000]}") from None

        # Prometheus scraped the driver's pod: time-to-target read back through its query API.
        ttt = prom.query(f'max_over_time(rlscale_time_to_target_seconds{{run="{RUN}"}}[30m])')
        assert ttt and float(ttt[0]["value"][1]) == pytest.approx(prog["timeToTargetSeconds"], rel=1e-3)

        # The report outlived the pods, on the checkpoint claim.
        report = tmp_path / "checkpoints" / "report"
        for f in ("metrics.jsonl", "plan.json", "summary.md", "curves.png"):
            assert (report / f).exists(), f
        recs = [json.loads(x) for x in (report / "metrics.jsonl").read_text().splitlines() if x.strip()]
        target = yaml.safe_load((REPO / "examples/quickstart-k8s.yaml").read_text())["spec"]["target"]["value"]
        assert recs[-1]["target_metric"] >= target and [r["step"] for r in recs] == list(range(1, len(recs) + 1))
        step_s = statistics.median(r["step_seconds"] for r in recs[len(recs) // 2:])
        print(f"apply -> first step in status {t_first:.0f} s; {len(recs)} steps, median {step_s:.3f} s per step "
              f"(second half); time to target {prog['timeToTarget']} at {prog['samplesToTarget']} samples",
              file=sys.stderr)
    finally:
        prom.stop()
        kubectl("delete", "namespace", NS, "--wait=false", check=False)


FAIL_NS = "failing-e2e"


def test_failing_runs_say_why_and_free_their_pods(node_cluster, images, tmp_path):
    """Two runs that cannot work, side by side in a restricted namespace: a reward that does not
    import (the driver reports it: Failed at once) and a model that is not in the cache (its init
    container crash-loops: Degraded, then Failed past the backoff limit). Each ends with its
    reason in a condition and an Event, and every workload at zero."""
    c = node_cluster
    kubectl = c.kubectl
    qs.helm_install(cp.bin_dir() / "helm", c.kubeconfig)  # a no-op after the quickstart test

    def get(kind: str, name: str | None = None, selector: str | None = None):
        args = ["get", kind, *([name] if name else []), "-n", FAIL_NS, "-o", "json",
                *(["-l", selector] if selector else [])]
        out = kubectl(*args, check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": FAIL_NS, "labels": PSS}}))
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                  "items": qs.claims(FAIL_NS, qs.model_cache(),
                                                                     tmp_path / "checkpoints")}))
    reward = qs.quickstart(task={"reward": "rlscale_no_such_module:score"})
    reward["metadata"]["name"] = "bad-reward"
    model = qs.quickstart(model={"path": "acme/not-in-the-cache", "shape": {
        "params": 3_400_000, "layers": 4, "hiddenSize": 256, "kvHeads": 4, "headDim": 64, "vocabSize": 32}},
        failurePolicy={"backoffLimit": 1})
    model["metadata"]["name"] = "missing-model"
    try:
        for obj in (reward, model):
            kubectl("apply", "-n", FAIL_NS, "-f", "-", input=json.dumps(obj))

        def failed(run: str):
            r = get("rlrun", run) or {}
            conds = {x["type"]: x for x in (r.get("status") or {}).get("conditions", [])}
            return conds if conds.get(C.COND_FAILED, {}).get("status") == "True" else None

        degraded_seen, init_states = [], []

        def model_failed():
            conds = (get("rlrun", "missing-model") or {}).get("status", {}).get("conditions", [])
            degraded_seen.extend(x for x in conds if x["type"] == C.COND_DEGRADED and x["status"] == "True")
            pods = (get("pods", selector=f"{C.LABEL_RUN}=missing-model,{C.LABEL_ROLE}={C.ROLE_LEARNER}")
                    or {}).get("items", [])
            init_states.extend(json.dumps(cs.get("state")) + f" restarts={cs.get('restartCount')}"
                               for p in pods for cs in p["status"].get("initContainerStatuses", []))
            return failed("missing-model")

        conds = wait("bad-reward Failed", lambda: failed("bad-reward"), 600, 3)
        f = conds[C.COND_FAILED]
        print(f"\nbad-reward: {f['reason']}: {f['message']}", file=sys.stderr)
        assert f["reason"] == "DriverFailed" and "rlscale_no_such_module" in f["message"], f
        conds = wait("missing-model Failed past its backoff limit", model_failed, 600, 3)
        f = conds[C.COND_FAILED]
        print(f"missing-model: {f['reason']}: {f['message']}", file=sys.stderr)
        assert f["reason"] == "BackoffLimitExceeded" and "spec.failurePolicy.backoffLimit (1)" in f["message"], f
        assert "acme/not-in-the-cache" in f["message"], f  # prepare-model's own words, from the log tail
        # Before the limit: Degraded, naming the exit (the first restarts come before the
        # kubelet reports CrashLoopBackOff).
        if not (degraded_seen and degraded_seen[0]["reason"] in ("LearnerExitedWithError", "LearnerCrashLoopBackOff")
                and "acme/not-in-the-cache" in degraded_seen[0]["message"]):
            logs = kubectl("logs", "-n", OPERATOR_NS, "deploy/rlscale-operator", "--tail=60", check=False).stdout
            raise AssertionError(f"no Degraded condition seen: {degraded_seen}\ninit container states: "
                                 f"{sorted(set(init_states))}\noperator log:\n{logs}")
        for run in ("bad-reward", "missing-model"):
            r = get("rlrun", run)
            assert r["status"]["phase"] == C.PHASE_FAILED
            n = B.names(run)
            for kind, name in (("deployment", n[C.ROLE_ROLLOUT]), ("statefulset", n[C.ROLE_LEARNER]),
                               ("deployment", n[C.ROLE_RAY_HEAD])):
                wait(f"{kind} {name} at zero", lambda k=kind, nm=name: get(k, nm)["spec"]["replicas"] == 0, 120)
            wait(f"{run}'s pods gone", lambda r=run: not get("pods", selector=f"{C.LABEL_RUN}={r}")["items"], 180)
        events = get("events")["items"]
        reasons = {(e["involvedObject"]["name"], e["reason"]) for e in events if e["involvedObject"]["kind"] == "RLRun"}
        assert ("missing-model", "BackoffLimitExceeded") in reasons, reasons
        row = kubectl("get", "rlrun", "missing-model", "-n", FAIL_NS).stdout.splitlines()[1].split()
        assert "Failed" in row
    finally:
        kubectl("delete", "namespace", FAIL_NS, "--wait=false", check=False)
