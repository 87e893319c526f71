"""A run of two rollout pods and two learner pods on the real node keeps strangers out, and meets
the faults of a shared GPU cluster one after the other and keeps training, losing at most one
checkpoint interval of samples each time.
Its task is a user's own: a JSONL file on the model claim and a reward plug-in in a ConfigMap.

- a pod in another namespace cannot open a TCP connection to the run's Ray head or rank 0's
  rendezvous port (the run's NetworkPolicy, which kube-router enforces on the real node); a pod in
  the run's namespace that wears the run's label, which the policy admits, is refused by the
  head (GCS and Ray Client) without the run's token or with a wrong one, and connects with it;
- the operator's leader killed mid-run (no grace): the standby replica takes the Lease within one
  lease duration and adopts the run; no pod of the run is replaced or restarted, the run goes on;
- a rollout pod killed mid-step (no grace): a request in flight is resent, and requests wait
  until Serve has a replica again; no step is lost and the learner keeps running;
- one learner rank's process killed (SIGKILL, not the driver's rank): the gang restarts and
  resumes from the newest checkpoint, losing at most `checkpoint.every` steps;
- suspend, then resume: the learner checkpoints on SIGTERM when its step can finish (at most
  one interval is lost when the rollout pods stop first);
- the Ray head killed: rank 0 sees a new cluster behind the head's Service and exits, so every
  pod of the run rejoins the new head and the learner resumes from the newest checkpoint
  (docs/operations.md, "Faults");
- the driver's rank grows past its container's memory limit and the kernel kills it: the run
  names it OOMKilled and resumes from the newest checkpoint;
- the node's kubelet stopped for 20 s and started: no pod is replaced, no step lost;
- then the run reaches its target (the test's plug-in lets it) and ends Succeeded: with two pods
  of each role and the default failure policy, no fault above failed it.

The run generates one step ahead of the learner (spec.algorithm.maxStaleness 1, chosen by the
plan): through every fault above, no batch trains more than one version after the weights that
generated it.

Samples lost are read off the run's own report: the steps a restart moved from metrics.jsonl to
metrics.redone.jsonl, each with its batch size.

The run happens once, in a module-scoped fixture that causes the faults one after the other and
records what it saw (tests/node/scenario.py); each test checks one property of that record, so a
property that fails does not hide the others."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hack import cluster as cp
from hack.cluster import nodeimages as ni
from hack.cluster import quickstart as qs
from hack.cluster import realnode as rn
from hack.cluster.procs import stop
from rlscale.operator import builders as B
from rlscale.operator import constants as C
from tests.node.runs import RunView, wait
from tests.node.scenario import Steps
from tests.node.strangers import TCP_WAIT_S, stranger_pod, token_attempts

# The timeout counts the whole fixture against the module's first test. It was 3000 s when the
# run stopped at its first failure; the fixture goes on to the next fault episodes after one the
# run did not recover from, and each may wait out its own timeout (at most 900 s): room for four.
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(3000 + 4 * 900)]


NS = "faults-e2e"
RUN = "faults"
EVERY = 5  # checkpoint.every: the most steps a crash may cost
ROLLOUTS, LEARNERS = 2, 2  # pods of each role: a fault of one must not fail the run
LEARNER_MEMORY = "4Gi"  # each learner container's limit, which the plug-in's hog passes
GCS_GIVE_UP_S = 60  # Ray's gcs_rpc_server_reconnect_timeout_s (its default)
STRANGER_NS = "faults-stranger"
PSS = {"pod-security.kubernetes.io/enforce": "restricted"}

# The run's reward, shipped to its learner pods in a ConfigMap: the quickstart's exact match.
PLUGIN = """
import os, re, time

_STARTED = time.time()
_DATA = "{data}"


def _since_start(name):
    # A trigger the test wrote after this process started (a restarted process ignores an old one).
    try:
        return os.stat(os.path.join(_DATA, name)).st_mtime > _STARTED
    except OSError:
        return False


def score(prompt, completion, answer, extra):
    if _since_start("oom-now"):
        # Grow this process (a reward worker of the learner's rank 0) past its container's memory limit.
        hog = []
        while True:
            hog.append(b"x" * (64 << 20))
    numbers = re.findall(r"-?[0-9]+", completion)
    right = 1.0 if numbers and numbers[-1] == answer else 0.0
    # Once the test says so, every reward is 100 higher: GRPO's group-normalised advantages do not
    # change, and eval/reward passes the run's target, so the run ends Succeeded on its own.
    return right + (100.0 if os.path.exists(os.path.join(_DATA, "finish-now")) else 0.0)
""".replace("{data}", f"{C.MODEL_MOUNT}/data")


# The scenario's steps, in the order they happen; the episodes' names are the `lost` table's keys.
INSTALLED = "the run installed"
STRANGER_STARTED = "the stranger pod started"
TRAINING = "the run training"
OPERATOR_RESTARTED = "operator leader killed"
ROLLOUT_KILLED = "rollout pod killed"
LEARNER_KILLED = "learner process killed"
SUSPENDED = "suspended"
RESUMED = "resumed"
STRANGER_READ = "the stranger pod's attempts read"
HEAD_KILLED = "ray head killed"
OOM_KILLED = "learner OOM-killed"
KUBELET_RESTARTED = "kubelet stopped and started"
FINISHED = "the run reached its target"
KUBELET_DOWN_S = 20  # under the node monitor's 40 s grace: the node is not marked NotReady
FINAL = "the run's final state read"
ROLES = (C.ROLE_RAY_HEAD, C.ROLE_ROLLOUT, C.ROLE_LEARNER)
OP_SEL = "app.kubernetes.io/name=rlscale"


@dataclass
class Facts:
    """What the faults run showed. A step that did not complete has its error in `steps`; what
    it would have recorded after the error keeps its default."""

    steps: Steps = field(default_factory=Steps)
    batch: int = 0  # samples per step
    # Per fault episode: steps and samples redone, the last step logged when it struck, seconds to recover.
    lost: dict[str, dict] = field(default_factory=dict)
    learner_log_at_start: str = ""
    sample: dict = field(default_factory=dict)  # the last logged step's sample once two checkpoints exist
    pods_before_operator_restart: dict = field(default_factory=dict)  # role -> {pod uid: restarts}
    pods_after_operator_restart: dict = field(default_factory=dict)
    operator_pods_after_restart: int = 0
    operator_pods_before_restart: list[str] = field(default_factory=list)
    leader_before: str = ""  # the Lease's holder (a pod name) before the kill, and after it
    leader_after: str = ""
    handover_s: float = 0.0  # seconds from the kill to the standby holding the Lease
    learner_before_rollout_kill: dict = field(default_factory=dict)  # {pod uid: restarts}
    learner_after_rollout_kill: dict = field(default_factory=dict)
    killed_rollout_pod: str = ""
    rollout_pods_after_kill: list[str] = field(default_factory=list)
    learner_log_after_kill: str = ""
    resumed_after_kill: list[int] = field(default_factory=list)  # "resumed from step N" in the learner's log
    seen_while_suspending: list[tuple[bool, bool]] = field(default_factory=list)  # (learner pods, rollout pods)
    step_at_suspend: int | None = None
    saved_at_suspend: int | None = None  # the newest checkpoint once suspended
    phase_when_suspended: str = ""
    learner_log_after_resume: str = ""
    stranger_said: dict[str, str] = field(default_factory=dict)  # attempt -> its RESULT line
    learner_log_at_head_loss: str = ""  # followed from before the kill
    learner_states: list[dict] = field(default_factory=list)  # learner-0's containers after the head's loss
    oom_reasons: set[str] = field(default_factory=set)  # learner-0's last termination reasons seen
    oom_degraded: set[str] = field(default_factory=set)  # the Degraded conditions seen meanwhile
    oom_events: list[str] = field(default_factory=list)  # the run's Events that name OOMKilled
    resumed_after_oom: list[int] = field(default_factory=list)
    pods_before_kubelet: dict = field(default_factory=dict)  # role -> {pod uid: restarts}
    pods_after_kubelet: dict = field(default_factory=dict)
    ended_at_step: int = 0
    final_steps: list[int] = field(default_factory=list)  # the steps in metrics.jsonl at the end
    final_staleness: list[int] = field(default_factory=list)  # each kept step's batch: versions behind
    final_conditions: dict[str, dict] = field(default_factory=dict)
    final_status: dict = field(default_factory=dict)


@pytest.fixture(scope="module")
def faults(node_cluster, images, tmp_path_factory) -> Iterator[Facts]:
    """The faults run, once for the module: every step in order, what it showed recorded; the
    namespaces are deleted after the module's tests."""
    scenario = FaultsRun(node_cluster, images, tmp_path_factory.mktemp("faults"))
    try:
        scenario.run_all()
        yield scenario.facts
    finally:
        for ns in (NS, STRANGER_NS):
            node_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


class FaultsRun:
    """The faults run's steps. Each fault episode needs only the run to have trained: after a
    fault the run did not recover from, the next episodes still run (and record their own
    errors)."""

    def __init__(self, cluster, images: dict[str, str], workdir: Path):
        self.c, self.kubectl, self.images, self.workdir = cluster, cluster.kubectl, images, workdir
        self.run = RunView(cluster.kubectl, NS, RUN, workdir / "checkpoints")
        self.facts = Facts()

    def run_all(self) -> None:
        s, f = self.facts.steps, self.facts
        s.run(INSTALLED, self.install)
        s.run(STRANGER_STARTED, self.start_stranger, needs=[INSTALLED])
        s.run(TRAINING, self.train, needs=[INSTALLED])
        s.run(OPERATOR_RESTARTED, self.restart_operator, needs=[TRAINING])
        s.run(ROLLOUT_KILLED, self.kill_rollout_pod, needs=[TRAINING])
        s.run(LEARNER_KILLED, self.kill_learner, needs=[TRAINING])
        s.run(SUSPENDED, self.suspend, needs=[TRAINING])
        # Resumed even when the suspension did not complete: `suspend: true` is undone either way.
        s.run(RESUMED, self.resume, needs=[TRAINING])
        s.run(STRANGER_READ, self.read_stranger, needs=[STRANGER_STARTED])
        s.run(HEAD_KILLED, self.kill_ray_head, needs=[TRAINING])
        s.run(OOM_KILLED, self.oom_learner, needs=[TRAINING])
        s.run(KUBELET_RESTARTED, self.restart_kubelet, needs=[TRAINING])
        s.run(FINISHED, self.finish, needs=[TRAINING])
        print(f"\nsamples lost per fault (checkpoint every {EVERY} steps of {f.batch} samples): "
              f"{json.dumps(f.lost, indent=1)}", file=sys.stderr)
        s.run(FINAL, self.read_final_state, needs=[TRAINING])  # the state after the faults, or none
        print(f"\nthe faults scenario's steps, seconds:\n{s.timeline()}", file=sys.stderr)

    # What the steps share.

    def advanced_past(self, step: int, by: int = 3):
        """The report shows `by` steps past `step` (the driver's log of steps it kept)."""
        logged = self.run.logged()
        return logged and logged[-1]["step"] >= step + by and logged[-1]["step"]

    def uids(self, role: str) -> dict[str, int]:
        return {p["metadata"]["uid"]: sum(cs.get("restartCount", 0) for cs in p["status"].get("containerStatuses", []))
                for p in self.run.running(role)}

    def episode(self, name: str, fault, recovered, timeout: float = 900) -> None:
        """Cause `fault`, wait until `recovered(last step logged when it struck)`, and record the
        steps and samples it cost, the seconds `fault` took (some wait for their moment) and the
        seconds from its start to the recovery."""
        run = self.run
        redone_before = len(run.redone())
        t0 = time.monotonic()
        fault()
        fault_s = time.monotonic() - t0
        last_before = run.logged()[-1]["step"]  # the fault may wait for its moment
        # Polled every second: most conditions read the report's file first and ask the API server
        # only once the steps are there.
        wait(f"the run to recover from: {name}", lambda: recovered(last_before), timeout, 1)
        new = run.redone()[redone_before:]
        self.facts.lost[name] = {"steps": len(new), "samples": sum(r["batch_samples"] for r in new),
                                 "last step before": last_before, "fault s": round(fault_s, 1),
                                 "recovered in s": round(time.monotonic() - t0)}
        print(f"\n{name}: {json.dumps(self.facts.lost[name])}", file=sys.stderr)

    def learner_log(self) -> str:
        return self.kubectl("logs", "-n", NS, f"{RUN}-learner-0", check=False).stdout

    # The steps.

    def install(self) -> None:
        kubectl = self.kubectl
        qs.helm_install(cp.bin_dir() / "helm", self.c.kubeconfig)  # a no-op after an earlier test
        for ns in (NS, STRANGER_NS):
            kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": ns, "labels": PSS}}))
        kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                      "items": qs.claims(NS, qs.model_cache(), self.run.checkpoints)}))
        # The task as a user brings their own: prompts from a JSONL file on the model claim, scored
        # by a plug-in shipped in a ConfigMap (task.pluginVolume); the quickstart's sums, so the
        # builtin model's tokenizer reads them.
        data = qs.model_cache() / "data" / "faults-sums.jsonl"
        data.parent.mkdir(parents=True, exist_ok=True)
        data.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                                for a in range(10, 100) for b in range(10, 100)))
        data.chmod(0o644)
        kubectl("apply", "-n", NS, "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "sums-reward"},
            "data": {"sums_reward.py": PLUGIN}}))
        for trigger in ("oom-now", "finish-now"):
            (data.parent / trigger).unlink(missing_ok=True)
        # The quickstart with two of each role, the default failure policy, a checkpoint every EVERY
        # steps, and a target (eval/reward 50) the run reaches only once the test writes finish-now.
        # The learners' memory is limited, so the plug-in's hog is killed by the kernel. It may
        # generate one step ahead (stale batches weighted by min(pi_old / pi_behaviour, 2)).
        obj = qs.quickstart(target={"metric": "eval/reward", "value": 50, "evalEvery": 10, "window": 2},
                            algorithm={"maxStaleness": 1, "isCap": 2.0},
                            budget={"maxSteps": 100000, "maxSamples": 10**9},
                            checkpoint={"every": EVERY},
                            rollout={"replicas": ROLLOUTS},
                            learner={"replicas": LEARNERS, "resources": {
                                "requests": {"cpu": "250m", "memory": "2Gi"}, "limits": {"memory": LEARNER_MEMORY}}},
                            # The hog's call lasts until the kernel kills it: once the kill came later than
                            # the default 10 s rewardTimeout (no OOM kill in the kernel log by then), and the
                            # run stopped for good on a slow reward instead.
                            task={"name": "sums", "dataset": f"{C.MODEL_MOUNT}/data/{data.name}",
                                  "promptField": "prompt", "evalSize": 64, "reward": "sums_reward:score",
                                  "rewardTimeout": 300,
                                  "pluginVolume": {"configMap": {"name": "sums-reward"}}})
        assert "failurePolicy" not in obj["spec"]
        obj["metadata"]["name"] = RUN
        self.facts.batch = obj["spec"]["batch"]["prompts"] * obj["spec"]["batch"]["samplesPerPrompt"]
        kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(obj))

    def start_stranger(self) -> None:
        """The strangers try the run while it trains (read before the head is killed)."""
        n = B.names(RUN)
        token_secret = wait("the run's Ray token Secret", lambda: self.run.get("secret", n[C.ROLE_TOKEN]), 60)
        token = base64.b64decode(token_secret["data"][C.TOKEN_KEY]).decode()
        image, head = self.images["RLSCALE_TRAINER_IMAGE"], f"{n[C.ROLE_RAY_HEAD]}.{NS}.svc"
        rank0 = f"{RUN}-learner-0.{n[C.ROLE_LEARNER]}.{NS}.svc"
        outsider = stranger_pod(image, STRANGER_NS, {}, {
            "tcp-gcs": (f"{head}:{C.RAY_GCS_PORT}", {}), "tcp-client": (f"{head}:{C.RAY_CLIENT_PORT}", {}),
            "tcp-rendezvous": (f"{rank0}:{C.MASTER_PORT}", {})})
        self.kubectl("apply", "-f", "-", input=json.dumps(outsider))
        insider = stranger_pod(image, NS, {C.LABEL_RUN: RUN}, token_attempts(head, token))
        self.kubectl("apply", "-f", "-", input=json.dumps(insider))

    def train(self) -> None:
        for role in ROLES:
            wait(f"{role} pod Running", lambda r=role: self.run.running(r), 900, 2)
        wait("two checkpoints", lambda: len(self.run.checkpoint_steps()) >= 2, 900, 2)
        self.facts.learner_log_at_start = self.learner_log()
        self.facts.sample = self.run.logged()[-1]["sample"]

    def restart_operator(self) -> None:
        """1. The operator's leader killed (no grace): the standby takes the Lease and adopts the run;
        nothing of the run is replaced."""
        run, f = self.run, self.facts
        f.pods_before_operator_restart = before = {role: self.uids(role) for role in ROLES}
        lease = f"{qs.OPERATOR_NS}/lease/rlscale-operator-leader"

        def holder() -> str:
            out = self.kubectl("get", "-n", qs.OPERATOR_NS, "lease", "rlscale-operator-leader", "-o", "json",
                               check=False)
            return json.loads(out.stdout)["spec"].get("holderIdentity") or "" if out.returncode == 0 else ""
        f.operator_pods_before_restart = sorted(
            p["metadata"]["name"] for p in run.get("pods", selector=OP_SEL, ns=qs.OPERATOR_NS)["items"])
        f.leader_before = wait(f"{lease} held", holder, 120, 1)
        status_step = run.step()
        t_kill = [0.0]

        def kill() -> None:
            t_kill[0] = time.monotonic()
            self.kubectl("delete", "pod", "-n", qs.OPERATOR_NS, f.leader_before, "--grace-period=0", "--force",
                         "--wait=false")

        def new_leader_reports():
            h = holder()
            if h and h != f.leader_before and not f.handover_s:
                f.leader_after, f.handover_s = h, round(time.monotonic() - t_kill[0], 1)
            # status.progress is the operator's copy of the driver's reports: it moves again.
            return f.handover_s and run.step() >= status_step + 5
        self.episode(OPERATOR_RESTARTED, kill, lambda _: new_leader_reports())
        print(f"\noperator leader {f.leader_before} killed: {f.leader_after} took the lease after "
              f"{f.handover_s}s", file=sys.stderr)
        f.pods_after_operator_restart = {role: self.uids(role) for role in before}
        wait("the operator Deployment back at two pods", lambda: len([
            p for p in run.get("pods", selector=OP_SEL, ns=qs.OPERATOR_NS)["items"]
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]) == 2, 300, 2)
        f.operator_pods_after_restart = len(run.get("pods", selector=OP_SEL, ns=qs.OPERATOR_NS)["items"])

    def kill_rollout_pod(self) -> None:
        """2. A rollout pod killed mid-step, with no grace: the request is resent, nothing redone."""
        run, f = self.run, self.facts
        f.learner_before_rollout_kill = self.uids(C.ROLE_LEARNER)
        f.killed_rollout_pod = rollout_pod = run.running(C.ROLE_ROLLOUT)[0]["metadata"]["name"]
        self.episode(ROLLOUT_KILLED, lambda: self.kubectl("delete", "pod", "-n", NS, rollout_pod, "--grace-period=0",
                                                          "--force", "--wait=false"),
                     lambda last: self.advanced_past(last) and run.running(C.ROLE_ROLLOUT))
        f.learner_after_rollout_kill = self.uids(C.ROLE_LEARNER)
        f.rollout_pods_after_kill = [p["metadata"]["name"] for p in run.running(C.ROLE_ROLLOUT)]
        # The kill lands anywhere in a step: inside a generation request (~40% of a step here)
        # the driver resends it; between requests the next one waits for the new replica.
        f.lost[ROLLOUT_KILLED]["requests resent"] = self.learner_log().count("retrying")

    def kill_learner(self) -> None:
        """3. One learner rank's process killed as the OOM killer does (SIGKILL, no checkpoint): the
        rank that is not the driver, so the gang restart is what brings rank 0 back."""
        run, f = self.run, self.facts
        victim = f"{RUN}-learner-{LEARNERS - 1}"
        learner = run.get("pod", victim)
        uid, restarts = learner["metadata"]["uid"], self.uids(C.ROLE_LEARNER)[learner["metadata"]["uid"]]
        cid = learner["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]

        def sigkill():
            # Between two checkpoints, so steps are really lost and redone: one to three steps past
            # one (the driver checkpoints step N right after logging it, so step N+1 logged means
            # N's checkpoint is complete; at N+4 the next one might complete before the kill lands).
            # From a random moment in the cycle of EVERY steps that waits 0.6 steps on average,
            # against 2.5 for one exact step past a checkpoint.
            wait("a step one to three past a checkpoint", lambda: 1 <= run.logged()[-1]["step"] % EVERY <= 3, 60, 0.1)
            sock = Path(self.c.containerd_socket)
            out = ni.ctr(sock, "task", "kill", "-s", "SIGKILL", cid)
            assert out.returncode == 0, out

        self.episode(LEARNER_KILLED, sigkill,
                     lambda last: self.advanced_past(last) and self.uids(C.ROLE_LEARNER).get(uid, -1) > restarts)
        f.learner_log_after_kill = self.learner_log()
        f.resumed_after_kill = [int(m) for m in re.findall(r"resumed from step (\d+)", f.learner_log_after_kill)]
        # Both ranks' logs, before and after the restart, kept with the scenario's files: where the
        # gang restart's seconds go (the pods' logs go with them at the suspension that follows).
        for rank in range(LEARNERS):
            for previous in (True, False):
                out = self.kubectl("logs", "-n", NS, f"{RUN}-learner-{rank}", "-c", "learner",
                                   *(["--previous"] if previous else []), "--timestamps", check=False)
                (self.workdir / f"learner-{rank}{'-previous' if previous else ''}-after-kill.log").write_text(
                    out.stdout + out.stderr)

    def oom_learner(self) -> None:
        """4. Rank 0 grows past its container's memory limit (the plug-in's hog, on a trigger file):
        the kernel kills it, the run says OOMKilled, and the gang resumes from its checkpoint."""
        run, f = self.run, self.facts
        rank0 = f"{RUN}-learner-0"

        def oom_seen():
            pod = run.get("pod", rank0) or {}
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                reason = ((cs.get("lastState") or {}).get("terminated") or {}).get("reason")
                if reason:
                    f.oom_reasons.add(reason)
            degraded = run.conditions().get(C.COND_DEGRADED) or {}
            if degraded.get("status") == "True":
                f.oom_degraded.add(f"{degraded.get('reason')}: {degraded.get('message', '')[:200]}")
            return "OOMKilled" in f.oom_reasons

        def trigger():
            (qs.model_cache() / "data" / "oom-now").write_text(str(time.time()))
        self.episode(OOM_KILLED, trigger, lambda last: oom_seen() and self.advanced_past(last))
        events = self.kubectl("get", "events", "-n", NS, "--field-selector", f"involvedObject.name={RUN}",
                              "-o", "json").stdout
        f.oom_events = [m for e in json.loads(events)["items"] if "OOMKilled" in (m := e.get("message", ""))]
        f.resumed_after_oom = [int(m) for m in re.findall(r"resumed from step (\d+)", self.learner_log())]

    def restart_kubelet(self) -> None:
        """5. The node's kubelet stopped for a while and started again (an upgrade, a crash): the pods'
        containers run on under containerd, and the new kubelet takes them over as they are."""
        f = self.facts
        f.pods_before_kubelet = {role: self.uids(role) for role in ROLES}

        def bounce():
            stop(self.c, ["kubelet"])
            time.sleep(KUBELET_DOWN_S)
            rn._start_kubelet(self.c)
        self.episode(KUBELET_RESTARTED, bounce, lambda last: self.advanced_past(last) and self.node_ready())
        f.pods_after_kubelet = {role: self.uids(role) for role in ROLES}

    def node_ready(self) -> bool:
        node = self.run.get("node", self.c.node_name, ns="") or {}
        conds = (node.get("status") or {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    def finish(self) -> None:
        """6. The test lets the run reach its target: it ends Succeeded, and the operator frees its pods."""
        run, f = self.run, self.facts
        (qs.model_cache() / "data" / "finish-now").write_text(str(time.time()))
        wait("the run Succeeded", lambda: run.status().get("phase") in (C.PHASE_SUCCEEDED, C.PHASE_FAILED), 900, 3)
        f.ended_at_step = run.logged()[-1]["step"]

    def set_suspend(self, flag: bool) -> None:
        self.kubectl("patch", "rlrun", RUN, "-n", NS, "--type=merge", "-p", json.dumps({"spec": {"suspend": flag}}))

    def suspend(self) -> None:
        """4. Suspend. The learners stop first: rank 0 finishes its step and checkpoints on
        SIGTERM while the rollout replicas still serve it; they stop once the last learner pod is
        gone (stopped together, the replicas went first once in eight runs, the step never
        finished and the grace period ran out; docs/operations.md)."""
        run, f = self.run, self.facts

        def suspended():
            learners, rollouts = bool(run.pods(C.ROLE_LEARNER)), bool(run.pods(C.ROLE_ROLLOUT))
            f.seen_while_suspending.append((learners, rollouts))
            return not learners and not rollouts
        self.episode(SUSPENDED, lambda: self.set_suspend(True), lambda _: suspended(), 300)
        f.step_at_suspend, f.saved_at_suspend = run.logged()[-1]["step"], run.checkpoint_steps()[-1]
        f.lost[SUSPENDED]["checkpointed on SIGTERM"] = f.saved_at_suspend == f.step_at_suspend
        f.phase_when_suspended = run.rlrun()["status"]["phase"]

    def resume(self) -> None:
        """4. ...then resume: the run goes on from the checkpoint the suspension left."""
        self.episode(RESUMED, lambda: self.set_suspend(False), self.advanced_past)
        self.facts.learner_log_after_resume = self.learner_log()

    def read_stranger(self) -> None:
        """What the strangers' attempts on the run said, while the run trained."""
        kubectl = self.kubectl

        def results(ns):
            pod = self.run.get("pod", "stranger", ns=ns)
            return (pod and pod["status"].get("phase") in ("Succeeded", "Failed")
                    and {cs["name"]: kubectl("logs", "stranger", "-n", ns, "-c", cs["name"]).stdout
                         for cs in pod["status"]["containerStatuses"]})
        said = self.facts.stranger_said
        for ns in (STRANGER_NS, NS):
            out = wait(f"the stranger pod's attempts in {ns}", lambda n=ns: results(n), 300 + TCP_WAIT_S, 3)
            said.update({name: next((ln for ln in text.splitlines() if ln.startswith("RESULT")), text[-300:])
                         for name, text in out.items()})
        print(f"\nthe run from a pod outside it: {json.dumps(said, indent=1)}", file=sys.stderr)

    def restarts(self) -> dict[str, dict[str, int]]:
        """role -> {pod uid: container restarts} of every pod of the run, ready or not (one API call)."""
        out: dict[str, dict[str, int]] = {}
        for p in self.run.pods():
            out.setdefault(p["metadata"]["labels"].get(C.LABEL_ROLE, ""), {})[p["metadata"]["uid"]] = sum(
                cs.get("restartCount", 0) for cs in p["status"].get("containerStatuses", []))
        return out

    def kill_ray_head(self) -> None:
        """5. The Ray head killed. Steps go on at first (the driver's calls to the replicas need
        no GCS); rank 0 and each rollout pod leave the lost cluster when their watch of the head
        sees the new one (it asks every 10 s; a rollout pod's `ray start --block` would exit by
        itself at Ray's 60 s GCS reconnect timeout). The run is judged once every Ray node of the
        lost cluster has left it (or, should one not say so, after that timeout plus a minute):
        every role running, and steps still being logged."""
        run, f = self.run, self.facts
        head = run.running(C.ROLE_RAY_HEAD)[0]["metadata"]["name"]
        restarts_before = {role: sum(self.uids(role).values()) for role in (C.ROLE_LEARNER, C.ROLE_ROLLOUT)}
        pods_before = {role: self.uids(role) for role in (C.ROLE_LEARNER, C.ROLE_ROLLOUT)}
        killed_at, settled = time.monotonic(), {}

        def left_the_lost_cluster() -> bool:
            """Rank 0 restarted, and each rollout pod restarted or was replaced."""
            now = self.restarts()
            learner, rollout = now.get(C.ROLE_LEARNER, {}), now.get(C.ROLE_ROLLOUT, {})
            rank0_left = any(learner.get(uid, -1) > n for uid, n in pods_before[C.ROLE_LEARNER].items())
            return rank0_left and all(rollout.get(uid, n + 1) > n for uid, n in pods_before[C.ROLE_ROLLOUT].items())

        def steady_after_head_loss(_last):
            if "step" not in settled:
                if time.monotonic() - killed_at < GCS_GIVE_UP_S + 60 and not left_the_lost_cluster():
                    return False
                settled.update(step=run.logged()[-1]["step"], after=round(time.monotonic() - killed_at, 1))
            return self.advanced_past(settled["step"]) and all(run.running(r) for r in ROLES)
        # The learner's log is followed from before the kill, so the container that sees the head
        # go is read while it runs: `kubectl logs --previous` afterwards answered "unable to
        # retrieve container logs" in one CI run (a container that has just exited is the newest
        # dead one, and the kubelet keeps one dead container per container).
        follow_log = self.workdir / "learner-at-head-loss.log"
        with follow_log.open("w") as sink:
            follower = subprocess.Popen([str(cp.bin_dir() / "kubectl"), f"--kubeconfig={self.c.kubeconfig}", "logs",
                                         "-f", "-n", NS, f"{RUN}-learner-0", "-c", "learner", "--tail=20"],
                                        stdout=sink, stderr=subprocess.STDOUT)
        try:
            self.episode(HEAD_KILLED, lambda: self.kubectl("delete", "pod", "-n", NS, head, "--grace-period=0",
                                                           "--force", "--wait=false"), steady_after_head_loss)
        finally:
            follower.kill()
            follower.wait()
            f.learner_log_at_head_loss = follow_log.read_text()
        f.lost[HEAD_KILLED]["restarts"] = {role: sum(self.uids(role).values()) - n
                                           for role, n in restarts_before.items()}
        f.lost[HEAD_KILLED]["judged from s"] = settled["after"]  # seconds after the kill
        print(f"ray head killed: {f.lost[HEAD_KILLED]}", file=sys.stderr)
        f.learner_states = [{k: cs.get(k) for k in ("restartCount", "state", "lastState")}
                            for cs in run.get("pod", f"{RUN}-learner-0")["status"]["containerStatuses"]]

    def read_final_state(self) -> None:
        f = self.facts
        logged = self.run.logged()
        f.final_steps = [r["step"] for r in logged]
        f.final_staleness = [r.get("staleness", 0) for r in logged]
        f.final_conditions = self.run.conditions()
        f.final_status = self.run.status()


# The properties, in the order the run meets them.


def costs_no_step(facts: Facts, name: str) -> None:
    facts.steps.require(name)
    assert facts.lost[name]["steps"] == 0, (name, facts.lost[name])


def costs_at_most_one_interval(facts: Facts, name: str) -> None:
    facts.steps.require(name)
    lost = facts.lost[name]
    assert lost["steps"] <= EVERY and lost["samples"] <= EVERY * facts.batch, (name, lost)


def test_the_task_comes_from_the_users_file_and_plugin(faults):
    """The prompts came from the file and the plug-in scored them, from the ConfigMap's mount."""
    faults.steps.require(TRAINING)
    log = faults.learner_log_at_start
    assert f"reward plug-in sums_reward:score from {C.PLUGINS_MOUNT}/sums_reward.py" in log
    assert re.search(r"\d+ train and \d+ held-out prompts", log), log[-3000:]
    sample = faults.sample
    assert re.fullmatch(r"\d\d\+\d\d=", sample["prompt"]) and sample["reward"] in (0.0, 1.0), sample


def test_a_killed_operator_leader_replaces_no_pod_of_the_run(faults):
    faults.steps.require(OPERATOR_RESTARTED)
    before, after = faults.pods_before_operator_restart, faults.pods_after_operator_restart
    assert after == before, f"pods replaced or restarted across the operator's restart: {before} -> {after}"
    assert faults.operator_pods_after_restart == 2


def test_the_standby_takes_over_from_a_killed_leader_within_one_lease(faults):
    faults.steps.require(OPERATOR_RESTARTED)
    f = faults
    assert len(f.operator_pods_before_restart) == 2 and f.leader_before in f.operator_pods_before_restart
    # The standby, not the leader's replacement pod (which starts as a standby and waits a lease).
    assert f.leader_after in f.operator_pods_before_restart and f.leader_after != f.leader_before
    # The chart's lease is 15 s; a standby polls every 2 s; the API calls and the poll of this test add a few.
    assert 0 < f.handover_s <= 15 + 2 + 8, f.handover_s


def test_an_operator_restart_costs_no_step(faults):
    costs_no_step(faults, OPERATOR_RESTARTED)


def test_a_killed_rollout_pod_is_replaced_without_restarting_the_learner(faults):
    faults.steps.require(ROLLOUT_KILLED)
    assert faults.learner_after_rollout_kill == faults.learner_before_rollout_kill, (
        "the learner restarted for a lost rollout replica")
    assert faults.killed_rollout_pod not in faults.rollout_pods_after_kill


def test_a_killed_rollout_pod_costs_no_step(faults):
    costs_no_step(faults, ROLLOUT_KILLED)


def test_a_killed_learner_resumes_from_its_newest_checkpoint(faults):
    faults.steps.require(LEARNER_KILLED)
    resumed = faults.resumed_after_kill
    assert resumed and resumed[-1] % EVERY == 0, faults.learner_log_after_kill[-3000:]
    assert faults.lost[LEARNER_KILLED]["steps"] >= 1, faults.lost  # the crash really cost steps


def test_a_killed_learner_costs_at_most_one_interval(faults):
    costs_at_most_one_interval(faults, LEARNER_KILLED)


def test_suspend_stops_every_learner_pod_no_later_than_the_rollout_pods(faults):
    faults.steps.require(SUSPENDED)
    seen = faults.seen_while_suspending
    assert (True, False) not in seen, f"a learner pod outlived the rollout pods: {seen}"


def test_suspend_checkpoints_on_sigterm_and_costs_no_step(faults):
    faults.steps.require(SUSPENDED)
    saved, at_suspend = faults.saved_at_suspend, faults.step_at_suspend
    assert at_suspend - EVERY <= saved <= at_suspend, (saved, at_suspend)
    assert faults.phase_when_suspended == C.PHASE_SUSPENDED
    costs_no_step(faults, SUSPENDED)


def test_resume_continues_from_the_suspend_checkpoint(faults):
    faults.steps.require(SUSPENDED, RESUMED)
    log = faults.learner_log_after_resume
    assert re.search(rf"resumed from step {faults.saved_at_suspend}\b", log), log[-3000:]


def test_resume_costs_at_most_one_interval(faults):
    costs_at_most_one_interval(faults, RESUMED)


def test_a_pod_in_another_namespace_cannot_open_a_connection_to_the_run(faults):
    """The run's NetworkPolicy, enforced on the real node, drops every connection from outside."""
    faults.steps.require(STRANGER_READ)
    said = faults.stranger_said
    for name in ("tcp-gcs", "tcp-client", "tcp-rendezvous"):
        assert said[name] == "RESULT unreachable", said


def test_strangers_without_the_runs_token_are_refused(faults):
    """Strangers in the run's namespace were kept out of the run's Ray cluster while it trained."""
    faults.steps.require(STRANGER_READ)
    said = faults.stranger_said
    for name in ("gcs-no-token", "gcs-wrong-token", "client-no-token"):
        assert said[name].startswith("RESULT refused"), said
    for name in ("gcs-no-token", "gcs-wrong-token"):
        assert "AuthenticationError" in said[name], said


def test_a_pod_with_the_runs_token_connects(faults):
    """The refusals are Ray's authentication, not an unreachable address."""
    faults.steps.require(STRANGER_READ)
    said = faults.stranger_said
    assert said["gcs-run-token"] == "RESULT connected" and said["client-run-token"] == "RESULT connected", said


def test_a_lost_ray_head_is_rejoined_by_the_driver_itself(faults):
    """The driver left the lost cluster by itself (trainer/gang.py HeadWatch) and rejoined."""
    faults.steps.require(HEAD_KILLED)
    assert faults.lost[HEAD_KILLED]["restarts"][C.ROLE_LEARNER] >= 1, faults.lost[HEAD_KILLED]
    log = faults.learner_log_at_head_loss
    assert "the run's Ray head was replaced" in log, (log[-3000:], faults.learner_states)


def test_a_lost_ray_head_costs_at_most_one_interval(faults):
    costs_at_most_one_interval(faults, HEAD_KILLED)


def test_the_run_keeps_one_history(faults):
    """Every step once in metrics.jsonl, after every fault."""
    faults.steps.require(FINAL)
    steps = faults.final_steps
    assert steps == list(range(1, len(steps) + 1))


def test_the_run_generated_ahead_and_kept_its_bound_through_every_fault(faults):
    """The plan chose to generate one step ahead (a re-plan may go back to 0), and no kept step trained
    a batch older than that."""
    faults.steps.require(FINAL)
    behind = faults.final_staleness
    assert set(behind) <= {0, 1} and 1 in behind, behind


def test_the_run_stays_healthy(faults):
    faults.steps.require(FINAL)
    assert faults.final_conditions.get(C.COND_FAILED, {}).get("status") != "True", faults.final_conditions


def test_the_run_ends_succeeded_after_every_fault_with_the_default_failure_policy(faults):
    faults.steps.require(FINISHED, FINAL)
    assert faults.final_status.get("phase") == C.PHASE_SUCCEEDED, (faults.final_status, faults.final_conditions)


def test_an_oom_killed_learner_is_named_so_and_resumes(faults):
    faults.steps.require(OOM_KILLED)
    f = faults
    assert "OOMKilled" in f.oom_reasons, f.oom_reasons
    # The operator said so, in a condition while it lasted or in the Event it posts for one.
    said = [d for d in f.oom_degraded if "OOMKilled" in d] + f.oom_events
    assert said, (f.oom_degraded, f.oom_events)
    # From the newest checkpoint, at most EVERY steps back. Not on a multiple of EVERY: after the
    # suspension the run checkpoints every EVERY steps from the step it resumed at (28, 33, ... 53
    # in one run). Two steps after the trigger may still finish and checkpoint: generating one step
    # ahead, the step in flight and the next, whose batch was scored before the trigger, train while
    # the first batch scored after it grows its reward worker (one run: last logged step 36,
    # resumed from the checkpoint of step 37; another: 45, the worker killed as step 47 ended,
    # resumed from 47).
    last = f.lost[OOM_KILLED]["last step before"]
    assert f.resumed_after_oom and last - EVERY <= f.resumed_after_oom[-1] <= last + 2, (f.resumed_after_oom, last)


def test_an_oom_killed_learner_costs_at_most_one_interval(faults):
    costs_at_most_one_interval(faults, OOM_KILLED)


def test_a_restarted_kubelet_replaces_no_pod_and_costs_no_step(faults):
    faults.steps.require(KUBELET_RESTARTED)
    assert faults.pods_after_kubelet == faults.pods_before_kubelet, (faults.pods_before_kubelet,
                                                                     faults.pods_after_kubelet)
    costs_no_step(faults, KUBELET_RESTARTED)
