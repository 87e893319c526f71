"""A run on the real node keeps strangers out, and meets the faults of a shared GPU cluster one
after the other and keeps training, losing at most one checkpoint interval of samples each time.
Its task is a user's own: a JSONL file on the model claim and a reward plug-in in a ConfigMap.

- a pod in another namespace is refused by the run's Ray head (GCS and Ray Client) without the
  run's token or with a wrong one, and connects with the run's token;
- the operator restarted mid-run: no pod of the run is replaced or restarted, the run goes on;
- a rollout pod killed mid-step (no grace): a request in flight is resent, and requests wait
  until Serve has a replica again; no step is lost and the learner keeps running;
- the learner's process killed (SIGKILL, as the kernel's OOM killer does): the pod restarts and
  resumes from the newest checkpoint, losing at most `checkpoint.every` steps;
- suspend, then resume: the learner checkpoints on SIGTERM when its step can finish (at most
  one interval is lost when the rollout pods stop first);
- the Ray head killed: rank 0 sees a new cluster behind the head's Service and exits, so every
  pod of the run rejoins the new head and the learner resumes from the newest checkpoint
  (docs/operations.md, "Faults").

Samples lost are read off the run's own report: the steps a restart moved from metrics.jsonl to
metrics.redone.jsonl, each with its batch size."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hack import cluster as cp
from hack.cluster import nodeimages as ni
from hack.cluster import quickstart as qs
from rlscale.operator import builders as B
from rlscale.operator import constants as C
from tests.node.runs import RunView, wait

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(3000)]

NS = "faults-e2e"
RUN = "faults"
EVERY = 5  # checkpoint.every: the most steps a crash may cost
GCS_GIVE_UP_S = 60  # Ray's gcs_rpc_server_reconnect_timeout_s (its default)
STRANGER_NS = "faults-stranger"
PSS = {"pod-security.kubernetes.io/enforce": "restricted"}

# A pod outside the run tries the run's Ray head: GCS (a GCS client's call, which needs no Ray
# node of its own) and Ray Client, with no token and with a wrong one (each must be refused),
# and with the run's own token (which must connect: so the refusals are Ray's authentication,
# not an unreachable address).
STRANGER = """
import os, socket, sys, time
host, port, address, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
end = time.time() + 600
while time.time() < end:
    try:
        socket.create_connection((host, port), 2).close()
        break
    except OSError:
        time.sleep(2)
else:
    print("RESULT unreachable", flush=True)
    sys.exit(0)
for attempt in range(4):
    try:
        if kind == "gcs":
            from ray._raylet import GcsClient
            GcsClient(address=address).internal_kv_keys(b"", None, timeout=30)
        else:
            import ray
            ray.init(address=address, log_to_driver=False)
        print("RESULT connected", flush=True)
        break
    except ConnectionAbortedError as exc:
        # Ray Client's server process for this connection did not come up in time on the busy
        # head ("Initialization failure from server"): that is no answer yet, so ask again.
        last = f"{type(exc).__name__} {str(exc)[:200]}"
        print("attempt", attempt, last, flush=True)
        time.sleep(10)
    except Exception as exc:
        print("RESULT refused", type(exc).__name__, str(exc)[:200], flush=True)
        break
else:
    print("RESULT refused", last, flush=True)
"""


# The run's reward, shipped to its learner pods in a ConfigMap: the quickstart's exact match.
PLUGIN = """
import re


def score(prompt, completion, answer, extra):
    numbers = re.findall(r"-?[0-9]+", completion)
    return 1.0 if numbers and numbers[-1] == answer else 0.0
"""


def test_a_run_survives_faults_losing_at_most_one_checkpoint_interval(node_cluster, images, tmp_path):
    c = node_cluster
    kubectl = c.kubectl
    ckpt = tmp_path / "checkpoints"
    run = RunView(kubectl, NS, RUN, ckpt)
    qs.helm_install(cp.bin_dir() / "helm", c.kubeconfig)  # a no-op after an earlier test
    for ns in (NS, STRANGER_NS):
        kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": ns, "labels": PSS}}))
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                  "items": qs.claims(NS, qs.model_cache(), ckpt)}))
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
    # The quickstart, with a target it never reaches (the test ends it), no evaluations in the
    # way, a checkpoint every EVERY steps, and room for the restarts the test causes.
    obj = qs.quickstart(target={"value": 0.999, "evalEvery": 1000}, budget={"maxSteps": 100000, "maxSamples": 10**9},
                        checkpoint={"every": EVERY}, failurePolicy={"backoffLimit": 20},
                        task={"name": "sums", "dataset": f"{C.MODEL_MOUNT}/data/{data.name}", "promptField": "prompt",
                              "evalSize": 64, "reward": "sums_reward:score",
                              "pluginVolume": {"configMap": {"name": "sums-reward"}}})
    obj["metadata"]["name"] = RUN
    batch = obj["spec"]["batch"]["prompts"] * obj["spec"]["batch"]["samplesPerPrompt"]
    lost: dict[str, dict] = {}

    def advanced_past(step: int, by: int = 3):
        """The report shows `by` steps past `step` (the driver's log of steps it kept)."""
        logged = run.logged()
        return logged and logged[-1]["step"] >= step + by and logged[-1]["step"]

    def uids(role: str) -> dict[str, int]:
        return {p["metadata"]["uid"]: sum(cs.get("restartCount", 0) for cs in p["status"].get("containerStatuses", []))
                for p in run.running(role)}

    def episode(name: str, fault, recovered, timeout: float = 900) -> None:
        """Cause `fault`, wait until `recovered(last step logged when it struck)`, and record the
        steps and samples it cost."""
        redone_before = len(run.redone())
        t0 = time.monotonic()
        fault()
        last_before = run.logged()[-1]["step"]  # the fault may wait for its moment
        wait(f"the run to recover from: {name}", lambda: recovered(last_before), timeout, 2)
        new = run.redone()[redone_before:]
        lost[name] = {"steps": len(new), "samples": sum(r["batch_samples"] for r in new),
                      "last step before": last_before, "recovered in s": round(time.monotonic() - t0)}
        print(f"\n{name}: {json.dumps(lost[name])}", file=sys.stderr)

    def learner_log() -> str:
        return kubectl("logs", "-n", NS, f"{RUN}-learner-0", check=False).stdout

    try:
        kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(obj))
        # A stranger tries the run's Ray head while it trains (checked before the head is killed).
        n = B.names(RUN)
        token_secret = wait("the run's Ray token Secret", lambda: run.get("secret", n[C.ROLE_TOKEN]), 60)
        token = base64.b64decode(token_secret["data"][C.TOKEN_KEY]).decode()
        kubectl("apply", "-f", "-", input=json.dumps(stranger_pod(images["RLSCALE_TRAINER_IMAGE"],
                                                                  f"{n[C.ROLE_RAY_HEAD]}.{NS}.svc", token)))
        for role in (C.ROLE_RAY_HEAD, C.ROLE_ROLLOUT, C.ROLE_LEARNER):
            wait(f"{role} pod Running", lambda r=role: run.running(r), 900, 2)
        wait("two checkpoints", lambda: len(run.checkpoint_steps()) >= 2, 900, 2)
        # The prompts came from the file and the plug-in scored them, from the ConfigMap's mount.
        assert f"reward plug-in sums_reward:score from {C.PLUGINS_MOUNT}/sums_reward.py" in learner_log()
        assert re.search(r"\d+ train and \d+ held-out prompts", learner_log()), learner_log()[-3000:]
        sample = run.logged()[-1]["sample"]
        assert re.fullmatch(r"\d\d\+\d\d=", sample["prompt"]) and sample["reward"] in (0.0, 1.0), sample

        # 1. The operator restarted mid-run: the new one adopts the run; nothing is replaced.
        before = {role: uids(role) for role in (C.ROLE_RAY_HEAD, C.ROLE_ROLLOUT, C.ROLE_LEARNER)}
        op_sel = "app.kubernetes.io/name=rlscale"
        op_uid = run.get("pods", selector=op_sel, ns=qs.OPERATOR_NS)["items"][0]["metadata"]["uid"]
        status_step = run.step()

        def new_operator_reports():
            pods = run.get("pods", selector=op_sel, ns=qs.OPERATOR_NS)["items"]
            fresh = [p for p in pods if p["metadata"]["uid"] != op_uid
                     and all(cs.get("ready") for cs in p["status"].get("containerStatuses", []))]
            # status.progress is the operator's copy of the driver's reports: it moves again.
            return fresh and run.step() >= status_step + 5
        episode("operator restarted",
                lambda: kubectl("delete", "pod", "-n", qs.OPERATOR_NS, "-l", op_sel, "--wait=false"),
                lambda _: new_operator_reports())
        after = {role: uids(role) for role in before}
        assert after == before, f"pods replaced or restarted across the operator's restart: {before} -> {after}"
        assert len(run.get("pods", selector=op_sel, ns=qs.OPERATOR_NS)["items"]) == 1

        # 2. A rollout pod killed mid-step, with no grace: the request is resent, nothing redone.
        learner_before = uids(C.ROLE_LEARNER)
        rollout_pod = run.running(C.ROLE_ROLLOUT)[0]["metadata"]["name"]
        episode("rollout pod killed", lambda: kubectl("delete", "pod", "-n", NS, rollout_pod, "--grace-period=0",
                                                      "--force", "--wait=false"),
                lambda last: run.running(C.ROLE_ROLLOUT) and advanced_past(last))
        assert uids(C.ROLE_LEARNER) == learner_before, "the learner restarted for a lost rollout replica"
        assert rollout_pod not in [p["metadata"]["name"] for p in run.running(C.ROLE_ROLLOUT)]
        # The kill lands anywhere in a step: inside a generation request (~40% of a step here)
        # the driver resends it; between requests the next one waits for the new replica.
        lost["rollout pod killed"]["requests resent"] = learner_log().count("retrying")

        # 3. The learner's process killed as the OOM killer does (SIGKILL, no checkpoint).
        [(uid, restarts)] = uids(C.ROLE_LEARNER).items()
        learner = run.get("pod", f"{RUN}-learner-0")
        cid = learner["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]

        def kill_learner():
            # Between two checkpoints (two steps past one), so steps are really lost and redone.
            wait("a step two past a checkpoint", lambda: run.logged()[-1]["step"] % EVERY == 2, 60, 0.1)
            sock = Path(c.containerd_socket)
            out = ni.ctr(sock, "task", "kill", "-s", "SIGKILL", cid)
            assert out.returncode == 0, out

        episode("learner process killed", kill_learner,
                lambda last: uids(C.ROLE_LEARNER).get(uid, -1) > restarts and advanced_past(last))
        resumed = [int(m) for m in re.findall(r"resumed from step (\d+)", learner_log())]
        assert resumed and resumed[-1] % EVERY == 0, learner_log()[-3000:]
        assert lost["learner process killed"]["steps"] >= 1, lost  # the crash really cost steps

        # 4. Suspend, then resume. The learners stop first: rank 0 finishes its step and
        # checkpoints on SIGTERM while the rollout replicas still serve it; they stop once the
        # last learner pod is gone (stopped together, the replicas went first once in eight
        # runs, the step never finished and the grace period ran out; docs/operations.md).
        def suspend(flag: bool):
            kubectl("patch", "rlrun", RUN, "-n", NS, "--type=merge", "-p", json.dumps({"spec": {"suspend": flag}}))

        seen: list[tuple[bool, bool]] = []

        def suspended():
            learners, rollouts = bool(run.pods(C.ROLE_LEARNER)), bool(run.pods(C.ROLE_ROLLOUT))
            seen.append((learners, rollouts))
            return not learners and not rollouts
        episode("suspended", lambda: suspend(True), lambda _: suspended(), 300)
        assert (True, False) not in seen, f"a learner pod outlived the rollout pods: {seen}"
        at_suspend, saved = run.logged()[-1]["step"], run.checkpoint_steps()[-1]
        lost["suspended"]["checkpointed on SIGTERM"] = saved == at_suspend
        assert at_suspend - EVERY <= saved <= at_suspend, (saved, at_suspend)
        assert run.rlrun()["status"]["phase"] == C.PHASE_SUSPENDED
        episode("resumed", lambda: suspend(False), advanced_past)
        assert re.search(rf"resumed from step {saved}\b", learner_log()), learner_log()[-3000:]

        # Strangers were kept out of the run's Ray cluster while it trained.
        results = wait("the stranger pod's attempts", lambda: (
            (pod := run.get("pod", "stranger", ns=STRANGER_NS))
            and pod["status"].get("phase") in ("Succeeded", "Failed")
            and {cs["name"]: kubectl("logs", "stranger", "-n", STRANGER_NS, "-c", cs["name"]).stdout
                 for cs in pod["status"]["containerStatuses"]}), 300, 3)
        said = {name: next((ln for ln in out.splitlines() if ln.startswith("RESULT")), out[-300:])
                for name, out in results.items()}
        print(f"\nRay from a pod outside the run: {json.dumps(said, indent=1)}", file=sys.stderr)
        for name in ("gcs-no-token", "gcs-wrong-token", "client-no-token"):
            assert said[name].startswith("RESULT refused"), said
        for name in ("gcs-no-token", "gcs-wrong-token"):
            assert "AuthenticationError" in said[name], said
        assert said["gcs-run-token"] == "RESULT connected" and said["client-run-token"] == "RESULT connected", said

        # 5. The Ray head killed. Steps go on at first (the driver's calls to the replicas need no
        # GCS); Ray's nodes give up on the lost GCS after its reconnect timeout (60 s), so the run
        # is judged well past that: every role running, and steps still being logged.
        head = run.running(C.ROLE_RAY_HEAD)[0]["metadata"]["name"]
        restarts_before = {role: sum(uids(role).values()) for role in (C.ROLE_LEARNER, C.ROLE_ROLLOUT)}
        killed_at, settled = time.monotonic(), {}

        def steady_after_head_loss(_last):
            if time.monotonic() - killed_at < GCS_GIVE_UP_S + 60:
                return False
            settled.setdefault("step", run.logged()[-1]["step"])
            return (all(run.running(r) for r in (C.ROLE_RAY_HEAD, C.ROLE_ROLLOUT, C.ROLE_LEARNER))
                    and advanced_past(settled["step"]))
        # The learner's log is followed from before the kill, so the container that sees the head
        # go is read while it runs: `kubectl logs --previous` afterwards answered "unable to
        # retrieve container logs" in one CI run (a container that has just exited is the newest
        # dead one, and the kubelet keeps one dead container per container).
        follow_log = tmp_path / "learner-at-head-loss.log"
        with follow_log.open("w") as sink:
            follower = subprocess.Popen([str(cp.bin_dir() / "kubectl"), f"--kubeconfig={c.kubeconfig}", "logs",
                                         "-f", "-n", NS, f"{RUN}-learner-0", "-c", "learner", "--tail=20"],
                                        stdout=sink, stderr=subprocess.STDOUT)
        try:
            episode("ray head killed", lambda: kubectl("delete", "pod", "-n", NS, head, "--grace-period=0", "--force",
                                                       "--wait=false"), steady_after_head_loss)
        finally:
            follower.kill()
            follower.wait()
        lost["ray head killed"]["restarts"] = {role: sum(uids(role).values()) - n
                                               for role, n in restarts_before.items()}
        print(f"ray head killed: {lost['ray head killed']}", file=sys.stderr)

        print(f"\nsamples lost per fault (checkpoint every {EVERY} steps of {batch} samples): "
              f"{json.dumps(lost, indent=1)}", file=sys.stderr)
        for name in ("operator restarted", "rollout pod killed", "suspended"):
            assert lost[name]["steps"] == 0, (name, lost[name])
        for name in ("learner process killed", "resumed", "ray head killed"):
            assert lost[name]["steps"] <= EVERY and lost[name]["samples"] <= EVERY * batch, (name, lost[name])
        # The driver left the lost cluster by itself (trainer/gang.py HeadWatch) and rejoined.
        assert lost["ray head killed"]["restarts"][C.ROLE_LEARNER] >= 1, lost["ray head killed"]
        learner_states = [{k: cs.get(k) for k in ("restartCount", "state", "lastState")}
                          for cs in run.get("pod", f"{RUN}-learner-0")["status"]["containerStatuses"]]
        assert "the run's Ray head was replaced" in follow_log.read_text(), (
            follow_log.read_text()[-3000:], learner_states)
        # One history: every step once in metrics.jsonl, and the run still healthy.
        steps = [r["step"] for r in run.logged()]
        assert steps == list(range(1, len(steps) + 1))
        conds = run.conditions()
        assert run.status().get("phase") == C.PHASE_RUNNING, run.status()
        assert conds.get(C.COND_FAILED, {}).get("status") != "True", conds
    finally:
        for ns in (NS, STRANGER_NS):
            kubectl("delete", "namespace", ns, "--wait=false", check=False)


def stranger_pod(image: str, head: str, token: str) -> dict:
    """One container per attempt; the image's Python, no account token, restricted-compliant."""
    wrong = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}
    right = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    gcs, client = f"{head}:{C.RAY_GCS_PORT}", f"ray://{head}:{C.RAY_CLIENT_PORT}"
    attempts = {"gcs-no-token": (gcs, {}), "gcs-wrong-token": (gcs, wrong), "gcs-run-token": (gcs, right),
                "client-no-token": (client, {}), "client-run-token": (client, right)}
    containers = []
    for name, (address, env) in attempts.items():
        port = address.rsplit(":", 1)[1]
        containers.append({
            "name": name, "image": image, "imagePullPolicy": "Never",
            "command": ["python", "-c", STRANGER, head, port, address, name.split("-")[0]],
            "env": [{"name": k, "value": v} for k, v in env.items()],
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            "resources": {"requests": {"cpu": "10m", "memory": "256Mi"}}})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stranger", "namespace": STRANGER_NS},
            "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False, "containers": containers,
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                         "seccompProfile": {"type": "RuntimeDefault"}}}}
