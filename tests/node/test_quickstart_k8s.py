"""The product's main path on the real node, as the README writes it: its Kubernetes block's lines
from `helm install` on, run as written (the chart with the operator image built here, the run's
namespace and claims from examples/cluster/quickstart-volumes.yaml, `kubectl apply -f
examples/quickstart-k8s.yaml`: 2 rollout pods, 2 learner pods of 2 ranks each, weights through
vLLM's protocol), and the operator's own pods train it to its target; a real Prometheus finds the
pods through the API server the way the chart's PodMonitor and ServiceMonitor ask, and every panel
of the Grafana dashboard has data. Then two runs that cannot work say why and free their pods.

Each scenario (the quickstart run; the two failing runs) happens once, in a fixture that records
what it saw (tests/node/scenario.py); each test checks one property of that record, so a
property that fails does not hide the others. The fixtures are class-scoped, one class per
scenario, so the quickstart's namespace and Prometheus go before the failing runs start."""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from hack import cluster as cp
from hack.cluster import quickstart as qs
from rlscale.operator import builders as B
from rlscale.operator import constants as C
from tests.e2e.conftest import prometheus_binary
from tests.node.runs import wait
from tests.node.scenario import Steps

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(3000)]

REPO = Path(__file__).resolve().parents[2]


OPERATOR_NS = qs.OPERATOR_NS
README = REPO / "README.md"
EXAMPLE = REPO / "examples/quickstart-k8s.yaml"
VOLUMES = REPO / "examples/cluster/quickstart-volumes.yaml"
_RUN = yaml.safe_load(EXAMPLE.read_text())
RUN, NS = _RUN["metadata"]["name"], _RUN["metadata"]["namespace"]
# The example at scale: rollout pods, learner pods of several ranks (a world each pod's launcher
# numbers its ranks in), every publish to every rollout pod.
ROLLOUT_REPLICAS = _RUN["spec"]["rollout"]["replicas"]
LEARNER_PODS, RANKS_PER_POD = _RUN["spec"]["learner"]["replicas"], _RUN["spec"]["learner"]["ranksPerReplica"]
WORLD_SIZE = LEARNER_PODS * RANKS_PER_POD
BY_GLOO = f"by gloo to {ROLLOUT_REPLICAS} replicas"
# The README's set-up lines the test's own fixtures stand for (its cluster, images built here and
# loaded into its node, its kubeconfig); every later line runs as written but the last, `kubectl get
# rlrun ... -w`, whose watching the test does by polling.
STANDS_FOR = ("make cluster", "export KUBECONFIG=", "make images", "bash hack/images/load.sh ")


def readme_block() -> list[str]:
    """The README's Kubernetes block: its commands, trailing comments dropped."""
    section = README.read_text().split("\n## On Kubernetes\n", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines() if line.strip()]


def readme_commands() -> tuple[list[str], str]:
    """(the lines the test runs as written, the watch line); the README changed where the test cannot
    follow it fails here, naming the line."""
    lines = readme_block()
    for i, prefix in enumerate(STANDS_FOR):
        assert lines[i].startswith(prefix), f"README's Kubernetes block line {i + 1}: {lines[i]!r}"
    run, watch = lines[len(STANDS_FOR):-1], lines[-1]
    assert watch.startswith(f"kubectl get rlrun {RUN} ") and watch.endswith(" -w"), watch
    assert run[0].startswith("helm install ") and f"kubectl apply -f {EXAMPLE.relative_to(REPO)}" in run, run
    return run, watch


def hostpath(pv: str) -> Path:
    """The hostPath of the README's PersistentVolume `pv`."""
    for doc in yaml.safe_load_all(VOLUMES.read_text()):
        if doc["kind"] == "PersistentVolume" and doc["metadata"]["name"] == pv:
            return Path(doc["spec"]["hostPath"]["path"])
    raise AssertionError(f"no PersistentVolume {pv} in {VOLUMES}")


# The run's namespace enforces the `restricted` Pod Security profile: a pod of the run that
# asked for more (root, a capability, a writable root filesystem...) would be refused.
PSS = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"}
ROLES = (C.ROLE_RAY_HEAD, C.ROLE_ROLLOUT, C.ROLE_LEARNER)


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
        try:
            wait("prometheus ready", lambda: self._get("/-/ready") is not None, 60)
        except AssertionError:
            self.stop()  # the fixture goes on without it: nothing else would stop it
            raise

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


def get(kubectl, kind: str, name: str | None = None, ns: str = NS, selector: str | None = None):
    args = ["get", kind, *([name] if name else []), "-n", ns, "-o", "json", *(["-l", selector] if selector else [])]
    out = kubectl(*args, check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def namespace_and_claims(kubectl, ns: str, checkpoints: Path) -> None:
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": ns, "labels": PSS}}))
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                  "items": qs.claims(ns, qs.model_cache(), checkpoints)}))


# The quickstart run's steps, in order.
OPERATOR = "the README's lines up to the RLRun run as written, the operator pod Ready"
PROMETHEUS = "Prometheus ready"
PODS = "the run's pods Running"
FIRST_STEP = "the first step in status"
LEARNER_LOG = "rank 0's log read (world size, weights by gloo to both replicas)"
PROGRESS = "steps progressing in status"
ENDED = "the run ended"
FREED = "the run's workloads at zero and pods gone"
ROW = "the run's kubectl row read"
PANELS = "every dashboard panel query returning data"
TIME_TO_TARGET = "time to target read from Prometheus"
REPORT = "the report read from the checkpoint claim"
REPORT_FILES = ("metrics.jsonl", "plan.json", "summary.md", "curves.png")


@dataclass
class Quickstart:
    """What the quickstart run showed. A step that did not complete has its error in `steps`;
    what it would have recorded after the error keeps its default."""

    node: str  # the real node's name
    checkpoints: Path  # the checkpoint claim's folder on this machine
    steps: Steps = field(default_factory=Steps)
    operator_node: str | None = None
    pod_nodes: dict[str, str] = field(default_factory=dict)  # role -> node of its first Running pod
    t_first: float = 0.0  # s from `kubectl apply` to the first step in status
    status: dict = field(default_factory=dict)  # the ended run's status
    conditions: dict[str, dict] = field(default_factory=dict)  # ... and its conditions by type
    row: list[str] = field(default_factory=list)  # `kubectl get rlrun`'s row, split
    time_to_target: list[dict] = field(default_factory=list)  # Prometheus' answer
    report_files: dict[str, bool] = field(default_factory=dict)  # file -> it exists
    records: list[dict] = field(default_factory=list)  # report/metrics.jsonl
    learner_log: str = ""  # the learner container's log of pod 0 (rank 0, the driver, and rank 1)
    pod_counts: dict[str, int] = field(default_factory=dict)  # role -> its pods Running at once
    freeing: list[tuple[int, int]] = field(default_factory=list)  # (head replicas, rollout pods) as polled
    freed_s: float = 0.0  # s from the run's end seen to its workloads at zero and its pods gone


@pytest.fixture(scope="class")
def quickstart(node_cluster, images, tmp_path_factory) -> Iterator[Quickstart]:
    """The quickstart run, once: every step in order, what it showed recorded; Prometheus stops
    and the namespace goes after the class's tests."""
    scenario = QuickstartRun(node_cluster, tmp_path_factory.mktemp("quickstart"))
    try:
        scenario.run_all()
        yield scenario.facts
    finally:
        try:
            if scenario.prom:
                scenario.prom.stop()
        finally:
            # The README's objects go (the namespace, its claims and the two PersistentVolumes); the
            # hostPath folders stay, the model built into them once.
            for f in (EXAMPLE, VOLUMES):
                node_cluster.kubectl("delete", "-f", str(f), "--wait=false", "--ignore-not-found", check=False)


class QuickstartRun:
    """The quickstart run's steps."""

    def __init__(self, cluster, workdir: Path):
        self.c, self.kubectl, self.workdir = cluster, cluster.kubectl, workdir
        self.facts = Quickstart(node=cluster.node_name, checkpoints=hostpath("rlscale-checkpoints"))
        self.commands, _ = readme_commands()
        # The README's lines run against this test's cluster, with its binaries first on PATH.
        self.env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "PATH": f"{cp.bin_dir()}:{os.environ['PATH']}"}
        self.prom: DiscoveringPrometheus | None = None
        self.t_apply = 0.0
        self.first = None  # the first step seen in status

    def run_all(self) -> None:
        s = self.facts.steps
        s.run(OPERATOR, self.install_operator)
        s.run(PROMETHEUS, self.start_prometheus, needs=[OPERATOR])
        s.run(PODS, self.apply, needs=[OPERATOR])
        s.run(FIRST_STEP, self.first_step, needs=[PODS])
        s.run(LEARNER_LOG, self.read_learner_log, needs=[FIRST_STEP])
        s.run(PROGRESS, self.steps_progress, needs=[FIRST_STEP])
        s.run(ENDED, self.wait_for_the_end, needs=[FIRST_STEP])
        s.run(FREED, self.wait_for_workloads_freed, needs=[ENDED])
        s.run(ROW, self.read_row, needs=[ENDED])
        s.run(PANELS, self.wait_for_panels, needs=[PROMETHEUS, PODS])
        s.run(TIME_TO_TARGET, self.read_time_to_target, needs=[PROMETHEUS, ENDED])
        s.run(REPORT, self.read_report, needs=[ENDED])

    def get(self, kind: str, name: str | None = None, ns: str = NS, selector: str | None = None):
        return get(self.kubectl, kind, name, ns, selector)

    def rlrun(self) -> dict:
        return self.get("rlrun", RUN) or {}

    def running(self, role: str) -> list[dict]:
        pods = self.get("pods", selector=f"{C.LABEL_RUN}={RUN},{C.LABEL_ROLE}={role}")["items"]
        return [p for p in pods if p["status"].get("phase") == "Running"]

    def readme_line(self, line: str) -> None:
        """One line of the README's block, as written, against this test's cluster."""
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", line], cwd=REPO, env=self.env, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, f"README line {line!r} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"

    def install_operator(self) -> None:
        """The README's lines before the RLRun's: `helm install` (a release another test of the session
        made goes first, as `helm install` refuses a name in use), the claims' folders, the namespace
        and claims. A checkpoint folder an earlier run left would make this one resume it: moved aside."""
        subprocess.run(["helm", "uninstall", "rlscale", "-n", OPERATOR_NS, "--wait", "--ignore-not-found"],
                       env=self.env, capture_output=True, timeout=300)
        old = self.facts.checkpoints
        if old.exists() and any(old.iterdir()):
            aside = old.with_name(old.name + ".previous")
            shutil.rmtree(aside, ignore_errors=True)
            old.rename(aside)
        for line in self.commands[:self.commands.index(f"kubectl apply -f {EXAMPLE.relative_to(REPO)}")]:
            self.readme_line(line)
        op = wait("the operator pod Ready", lambda: [
            p for p in self.get("pods", ns=OPERATOR_NS, selector="app.kubernetes.io/name=rlscale")["items"]
            if any(s.get("ready") for s in p["status"].get("containerStatuses", []))], 300)
        self.facts.operator_node = op[0]["spec"]["nodeName"]

    def start_prometheus(self) -> None:
        self.prom = DiscoveringPrometheus(self.workdir, self.c, NS)

    def apply(self) -> None:
        self.t_apply = time.monotonic()
        apply = self.commands.index(f"kubectl apply -f {EXAMPLE.relative_to(REPO)}")
        for line in self.commands[apply:]:
            self.readme_line(line)
        # The learner pod installs the model into the claim on a cold machine (the shipped build:
        # seconds; the recipe, where none ships, took 690 s in the pod on a 2-core machine beside
        # the run's other pods), then DeepSpeed and vLLM start.
        want = {C.ROLE_RAY_HEAD: 1, C.ROLE_ROLLOUT: ROLLOUT_REPLICAS, C.ROLE_LEARNER: LEARNER_PODS}
        for role in ROLES:
            pods = wait(f"{want[role]} {role} pods Running",
                        lambda r=role: (lambda p: p if len(p) >= want[r] else None)(self.running(r)), 1500)
            self.facts.pod_nodes[role] = pods[0]["spec"]["nodeName"]
            self.facts.pod_counts[role] = len(pods)

    def progress_step(self):
        return (self.rlrun().get("status") or {}).get("progress", {}).get("step")

    def first_step(self) -> None:
        self.first = wait("the first step in status", self.progress_step, 900)
        self.facts.t_first = time.monotonic() - self.t_apply

    def read_learner_log(self) -> None:
        """Pod 0's learner container (its launcher's two ranks) while the run trains: rank 0 says the
        world size once it has joined and how each publish reached the replicas. The first step in
        status means one publish is done; the pod's log goes with the pod, so it is read now."""
        pod = f"{B.names(RUN)[C.ROLE_LEARNER]}-0"

        def said():
            out = self.kubectl("logs", pod, "-c", C.ROLE_LEARNER, "-n", NS, check=False)
            self.facts.learner_log = out.stdout if out.returncode == 0 else self.facts.learner_log
            return f"of {WORLD_SIZE} ready" in self.facts.learner_log and BY_GLOO in self.facts.learner_log
        wait("rank 0's log to name the world size and a publish to both replicas", said, 120, 2)

    def steps_progress(self) -> None:
        steps_seen = {self.first}
        wait("steps progressing in status", lambda: steps_seen.add(
            self.progress_step()) or len(steps_seen - {None}) >= 3, 300)

    def wait_for_the_end(self) -> None:
        """The target is reached and the run ends (then: Succeeded, every workload at zero)."""
        def ended():
            r = self.rlrun()
            conds = {x["type"]: x for x in (r.get("status") or {}).get("conditions", [])}
            done = any(conds.get(t, {}).get("status") == "True"
                       for t in (C.COND_SUCCEEDED, C.COND_BUDGET_EXHAUSTED, C.COND_INVALID))
            return (r, conds) if done or r.get("status", {}).get("phase") == C.PHASE_FAILED else None
        r, self.facts.conditions = wait("the run to end (the driver's last report)", ended, 1500, 3)
        self.facts.status = r["status"]

    def wait_for_workloads_freed(self) -> None:
        """Every workload at zero and every pod gone; the head's count and the rollout pods are
        recorded as they go (the head is read first: a rollout pod seen after it was there before)."""
        n, t0 = B.names(RUN), time.monotonic()

        def freed() -> bool:
            head = self.get("deployment", n[C.ROLE_RAY_HEAD])["spec"]["replicas"]
            pods = self.get("pods", selector=f"{C.LABEL_RUN}={RUN}")["items"]
            rollout = sum(p["metadata"]["labels"].get(C.LABEL_ROLE) == C.ROLE_ROLLOUT for p in pods)
            self.facts.freeing.append((head, rollout))
            zero = all(self.get(k, nm)["spec"]["replicas"] == 0
                       for k, nm in (("deployment", n[C.ROLE_ROLLOUT]), ("statefulset", n[C.ROLE_LEARNER])))
            return zero and head == 0 and not pods
        wait("every workload at zero and the run's pods gone", freed, 180)
        self.facts.freed_s = time.monotonic() - t0

    def read_row(self) -> None:
        self.facts.row = self.kubectl("get", "rlrun", RUN, "-n", NS).stdout.splitlines()[1].split()

    def wait_for_panels(self) -> None:
        """Every panel of the dashboard had data while the run trained (the run may end within
        seconds of its first step, so each panel's query is looked back on over the run)."""
        prom = self.prom

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

    def read_time_to_target(self) -> None:
        """Prometheus scraped the driver's pod: time-to-target read back through its query API."""
        expr = f'max_over_time(rlscale_time_to_target_seconds{{run="{RUN}"}}[30m])'
        self.facts.time_to_target = self.prom.query(expr)

    def read_report(self) -> None:
        """The report outlived the pods, on the checkpoint claim."""
        report = self.facts.checkpoints / "report"
        self.facts.report_files = {f: (report / f).exists() for f in REPORT_FILES}
        if self.facts.report_files["metrics.jsonl"]:
            self.facts.records = [json.loads(x) for x in (report / "metrics.jsonl").read_text().splitlines()
                                  if x.strip()]


class TestQuickstart:
    """`kubectl apply -f examples/quickstart-k8s.yaml` trains the quickstart to its target on the
    operator's own pods."""

    def test_the_operator_pod_runs_on_the_real_node(self, quickstart):
        quickstart.steps.require(OPERATOR)
        assert quickstart.operator_node == quickstart.node

    @pytest.mark.parametrize("role", ROLES)
    def test_the_runs_pods_run_on_the_real_node(self, quickstart, role):
        if role not in quickstart.pod_nodes:
            quickstart.steps.require(PODS)
        assert quickstart.pod_nodes[role] == quickstart.node, "run pods land on the real node"

    def test_steps_progress_in_status(self, quickstart):
        quickstart.steps.require(FIRST_STEP, PROGRESS)

    def test_two_learner_pods_of_two_ranks_train_as_a_world_of_four_with_weights_to_both_replicas(self, quickstart):
        if not quickstart.learner_log:
            quickstart.steps.require(LEARNER_LOG)
        log = quickstart.learner_log
        assert f"rank 0 of {WORLD_SIZE} ready" in log, log[-3000:]
        assert f"rank 1 of {WORLD_SIZE} ready" in log, log[-3000:]  # pod 0's second rank, same container
        assert BY_GLOO in log, log[-3000:]  # vLLM's protocol, one group with both replicas' workers
        quickstart.steps.require(PODS)
        assert quickstart.pod_counts[C.ROLE_LEARNER] == LEARNER_PODS
        assert quickstart.pod_counts[C.ROLE_ROLLOUT] == ROLLOUT_REPLICAS

    def test_the_run_succeeds_at_its_target(self, quickstart):
        quickstart.steps.require(ENDED)
        st, cond = quickstart.status, quickstart.conditions
        assert st["phase"] == C.PHASE_SUCCEEDED, json.dumps(st, indent=1)
        assert cond[C.COND_SUCCEEDED]["status"] == "True", cond
        print(f"\nSucceeded condition: {cond[C.COND_SUCCEEDED]['message']}", file=sys.stderr)
        prog = st["progress"]
        assert prog["targetReached"] and prog["timeToTargetSeconds"] > 0 and prog["samplesToTarget"] > 0

    def test_the_ended_run_scales_its_workloads_to_zero_and_its_pods_go(self, quickstart):
        quickstart.steps.require(FREED)
        # The Ray head goes last: a rollout pod stopping after it waits out Ray's 60 s GCS reconnect timeout
        # (bench/ray_drain.py).
        assert not [s for s in quickstart.freeing if s[0] == 0 and s[1]], quickstart.freeing
        print(f"\nthe end seen -> every pod gone in {quickstart.freed_s:.0f} s", file=sys.stderr)

    def test_kubectl_get_shows_the_run_succeeded_with_its_time_to_target(self, quickstart):
        quickstart.steps.require(ENDED, ROW)
        row = quickstart.row
        assert "Succeeded" in row and quickstart.status["progress"]["timeToTarget"] in row

    def test_every_dashboard_panel_had_data(self, quickstart):
        quickstart.steps.require(PANELS)

    def test_prometheus_reads_the_time_to_target_in_status(self, quickstart):
        quickstart.steps.require(ENDED, TIME_TO_TARGET)
        ttt, prog = quickstart.time_to_target, quickstart.status["progress"]
        assert ttt and float(ttt[0]["value"][1]) == pytest.approx(prog["timeToTargetSeconds"], rel=1e-3)

    def test_the_finished_run_exported_its_weights_to_the_claim_and_says_where(self, quickstart):
        quickstart.steps.require(ENDED)
        export = quickstart.status["progress"].get("export") or {}
        assert export.get("path") == "/checkpoints/export/hf" and not export.get("error"), export
        assert "exported to /checkpoints/export/hf" in quickstart.conditions[C.COND_SUCCEEDED]["message"]
        hf = quickstart.checkpoints / "export" / "hf"
        assert (hf / "config.json").is_file() and list(hf.glob("*.safetensors")), sorted(hf.parent.iterdir())

    def test_the_report_outlives_the_pods_on_the_checkpoint_claim(self, quickstart):
        quickstart.steps.require(ENDED, REPORT)
        for f in REPORT_FILES:
            assert quickstart.report_files[f], f
        recs, prog = quickstart.records, quickstart.status["progress"]
        target = _RUN["spec"]["target"]["value"]
        assert recs[-1]["target_metric"] >= target and [r["step"] for r in recs] == list(range(1, len(recs) + 1))
        step_s = statistics.median(r["step_seconds"] for r in recs[len(recs) // 2:])
        print(f"apply -> first step in status {quickstart.t_first:.0f} s; {len(recs)} steps, median {step_s:.3f} s "
              f"per step (second half); time to target {prog['timeToTarget']} at {prog['samplesToTarget']} samples",
              file=sys.stderr)


FAIL_NS = "failing-e2e"
FAILING = ("bad-reward", "missing-model")
# The failing runs' steps, in order.
FAILING_APPLIED = "the failing runs applied"
REWARD_FAILED = "bad-reward Failed"
MODEL_FAILED = "missing-model Failed past its backoff limit"
EVENTS = "the runs' Events read"
FAILED_ROW = "missing-model's kubectl row read"


def freed(run: str) -> str:
    """The name of the step that waits for `run`'s workloads at zero and its pods gone."""
    return f"{run}'s workloads at zero and pods gone"


def degraded_named_the_exit(seen: list[dict]) -> bool:
    """Before the limit: Degraded, naming the exit (the first restarts come before the kubelet
    reports CrashLoopBackOff)."""
    return bool(seen and seen[0]["reason"] in ("LearnerExitedWithError", "LearnerCrashLoopBackOff")
                and "acme/not-in-the-cache" in seen[0]["message"])


@dataclass
class FailingRuns:
    """What the two failing runs showed. A step that did not complete has its error in `steps`;
    what it would have recorded after the error keeps its default."""

    steps: Steps = field(default_factory=Steps)
    failed: dict[str, dict] = field(default_factory=dict)  # run -> its conditions once Failed
    degraded_seen: list[dict] = field(default_factory=list)  # missing-model's Degraded conditions, as polled
    init_states: list[str] = field(default_factory=list)  # its learner pods' init containers, as polled
    operator_log: str = ""  # the operator's log tail, read when no Degraded condition named the exit
    phases: dict[str, str] = field(default_factory=dict)  # run -> phase once both runs Failed
    event_reasons: set[tuple[str, str]] = field(default_factory=set)  # (RLRun, reason) of the namespace's Events
    row: list[str] = field(default_factory=list)  # `kubectl get rlrun missing-model`'s row, split


@pytest.fixture(scope="class")
def failing(node_cluster, images, tmp_path_factory) -> Iterator[FailingRuns]:
    """Two runs that cannot work, side by side in a restricted namespace, once: every step in
    order, what they showed recorded; the namespace goes after the class's tests."""
    scenario = FailingRunsRun(node_cluster, tmp_path_factory.mktemp("failing"))
    try:
        scenario.run_all()
        yield scenario.facts
    finally:
        node_cluster.kubectl("delete", "namespace", FAIL_NS, "--wait=false", check=False)


class FailingRunsRun:
    """The failing runs' steps."""

    def __init__(self, cluster, workdir: Path):
        self.c, self.kubectl, self.workdir = cluster, cluster.kubectl, workdir
        self.facts = FailingRuns()

    def run_all(self) -> None:
        s = self.facts.steps
        s.run(FAILING_APPLIED, self.apply)
        s.run(REWARD_FAILED, self.wait_for_bad_reward, needs=[FAILING_APPLIED])
        s.run(MODEL_FAILED, self.wait_for_missing_model, needs=[FAILING_APPLIED])
        for run, failed in zip(FAILING, (REWARD_FAILED, MODEL_FAILED), strict=True):
            s.run(freed(run), lambda r=run: self.wait_for_workloads_freed(r), needs=[failed])
        s.run(EVENTS, self.read_events, needs=[FAILING_APPLIED])
        s.run(FAILED_ROW, self.read_row, needs=[FAILING_APPLIED])

    def get(self, kind: str, name: str | None = None, selector: str | None = None):
        return get(self.kubectl, kind, name, FAIL_NS, selector)

    def apply(self) -> None:
        qs.helm_install(cp.bin_dir() / "helm", self.c.kubeconfig)  # a no-op after the quickstart
        namespace_and_claims(self.kubectl, FAIL_NS, self.workdir / "checkpoints")
        reward = qs.quickstart(task={"reward": "rlscale_no_such_module:score"})
        reward["metadata"]["name"] = "bad-reward"
        model = qs.quickstart(model={"path": "acme/not-in-the-cache", "shape": {
            "params": 3_400_000, "layers": 4, "hiddenSize": 256, "kvHeads": 4, "headDim": 64, "vocabSize": 32}},
            failurePolicy={"backoffLimit": 1})
        model["metadata"]["name"] = "missing-model"
        for obj in (reward, model):
            self.kubectl("apply", "-n", FAIL_NS, "-f", "-", input=json.dumps(obj))

    def failed(self, run: str):
        r = self.get("rlrun", run) or {}
        conds = {x["type"]: x for x in (r.get("status") or {}).get("conditions", [])}
        return conds if conds.get(C.COND_FAILED, {}).get("status") == "True" else None

    def wait_for_bad_reward(self) -> None:
        conds = wait("bad-reward Failed", lambda: self.failed("bad-reward"), 600, 3)
        self.facts.failed["bad-reward"] = conds
        f = conds[C.COND_FAILED]
        print(f"\nbad-reward: {f['reason']}: {f['message']}", file=sys.stderr)

    def wait_for_missing_model(self) -> None:
        facts = self.facts

        def model_failed():
            conds = (self.get("rlrun", "missing-model") or {}).get("status", {}).get("conditions", [])
            facts.degraded_seen.extend(x for x in conds if x["type"] == C.COND_DEGRADED and x["status"] == "True")
            pods = (self.get("pods", selector=f"{C.LABEL_RUN}=missing-model,{C.LABEL_ROLE}={C.ROLE_LEARNER}")
                    or {}).get("items", [])
            facts.init_states.extend(json.dumps(cs.get("state")) + f" restarts={cs.get('restartCount')}"
                                     for p in pods for cs in p["status"].get("initContainerStatuses", []))
            return self.failed("missing-model")
        try:
            conds = wait("missing-model Failed past its backoff limit", model_failed, 600, 3)
        finally:
            if not degraded_named_the_exit(facts.degraded_seen):
                facts.operator_log = self.kubectl("logs", "-n", OPERATOR_NS, "deploy/rlscale-operator", "--tail=60",
                                                  check=False).stdout
        facts.failed["missing-model"] = conds
        f = conds[C.COND_FAILED]
        print(f"missing-model: {f['reason']}: {f['message']}", file=sys.stderr)

    def wait_for_workloads_freed(self, run: str) -> None:
        self.facts.phases[run] = self.get("rlrun", run)["status"]["phase"]
        n = B.names(run)
        for kind, name in (("deployment", n[C.ROLE_ROLLOUT]), ("statefulset", n[C.ROLE_LEARNER]),
                           ("deployment", n[C.ROLE_RAY_HEAD])):
            wait(f"{kind} {name} at zero", lambda k=kind, nm=name: self.get(k, nm)["spec"]["replicas"] == 0, 120)
        wait(f"{run}'s pods gone", lambda: not self.get("pods", selector=f"{C.LABEL_RUN}={run}")["items"], 180)

    def read_events(self) -> None:
        events = self.get("events")["items"]
        self.facts.event_reasons = {(e["involvedObject"]["name"], e["reason"]) for e in events
                                    if e["involvedObject"]["kind"] == "RLRun"}

    def read_row(self) -> None:
        self.facts.row = self.kubectl("get", "rlrun", "missing-model", "-n", FAIL_NS).stdout.splitlines()[1].split()


class TestFailingRuns:
    """Two runs that cannot work, side by side in a restricted namespace: a reward that does not
    import (the driver reports it: Failed at once) and a model that is not in the cache (its init
    container crash-loops: Degraded, then Failed past the backoff limit). Each ends with its
    reason in a condition and an Event, and every workload at zero."""

    def test_a_reward_that_does_not_import_fails_naming_the_module(self, failing):
        failing.steps.require(REWARD_FAILED)
        f = failing.failed["bad-reward"][C.COND_FAILED]
        assert f["reason"] == "DriverFailed" and "rlscale_no_such_module" in f["message"], f

    def test_a_missing_model_fails_past_its_backoff_limit_naming_the_model(self, failing):
        failing.steps.require(MODEL_FAILED)
        f = failing.failed["missing-model"][C.COND_FAILED]
        assert f["reason"] == "BackoffLimitExceeded" and "spec.failurePolicy.backoffLimit (1)" in f["message"], f
        assert "acme/not-in-the-cache" in f["message"], f  # prepare-model's own words, from the log tail

    def test_a_missing_model_is_degraded_naming_the_exit_before_the_limit(self, failing):
        failing.steps.require(FAILING_APPLIED)
        if not degraded_named_the_exit(failing.degraded_seen):
            raise AssertionError(f"no Degraded condition seen: {failing.degraded_seen}\ninit container states: "
                                 f"{sorted(set(failing.init_states))}\noperator log:\n{failing.operator_log}")

    @pytest.mark.parametrize("run", FAILING)
    def test_a_failed_run_ends_failed_with_every_workload_at_zero_and_no_pod(self, failing, run):
        if run not in failing.phases:
            failing.steps.require(freed(run))
        assert failing.phases[run] == C.PHASE_FAILED
        failing.steps.require(freed(run))

    def test_the_backoff_limit_is_an_event_of_the_run(self, failing):
        failing.steps.require(EVENTS)
        reasons = failing.event_reasons
        assert ("missing-model", "BackoffLimitExceeded") in reasons, reasons

    def test_kubectl_get_shows_the_run_failed(self, failing):
        failing.steps.require(FAILED_ROW)
        assert "Failed" in failing.row
