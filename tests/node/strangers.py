"""The strangers of the faults run (tests/node/test_faults_k8s.py): pods that try to reach the run's Ray
head and rank 0's rendezvous port, from another namespace and from inside the run's with and without
its token; each container prints one RESULT line."""

from __future__ import annotations

from rlscale.operator import constants as C

TCP_WAIT_S = 60  # how long the outsider keeps trying each port before it calls it unreachable

# Two strangers. One in another namespace tries to open TCP connections to the run's Ray head
# (GCS, Ray Client) and rank 0's rendezvous port: the run's NetworkPolicy must drop them. One in
# the run's namespace wearing the run's label, which the policy lets through, tries the head: GCS
# (a GCS client's call, which needs no Ray node of its own) and Ray Client, with no token and with
# a wrong one (each must be refused), and with the run's own token (which must connect: so the
# refusals are Ray's authentication, not an unreachable address).
STRANGER = """
import os, socket, sys, time
host, port, address, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
# From outside the run's namespace a TCP connection is all there is to try (the NetworkPolicy
# drops it): unreachable once TCP_WAIT_S passes without one; from inside, wait for the head.
end = time.time() + (float(os.environ["TCP_WAIT_S"]) if kind == "tcp" else 600)
while time.time() < end:
    try:
        socket.create_connection((host, port), 2).close()
        break
    except OSError:
        time.sleep(2)
else:
    print("RESULT unreachable", flush=True)
    sys.exit(0)
if kind == "tcp":
    print("RESULT connected", flush=True)
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


def token_attempts(head: str, token: str) -> dict[str, tuple[str, dict]]:
    """The insider's attempts on the head: name -> (address, env), without and with tokens."""
    wrong = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}
    right = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    gcs, client = f"{head}:{C.RAY_GCS_PORT}", f"ray://{head}:{C.RAY_CLIENT_PORT}"
    return {"gcs-no-token": (gcs, {}), "gcs-wrong-token": (gcs, wrong), "gcs-run-token": (gcs, right),
            "client-no-token": (client, {}), "client-run-token": (client, right)}


def stranger_pod(image: str, namespace: str, labels: dict, attempts: dict[str, tuple[str, dict]]) -> dict:
    """One container per attempt (its name's first word is its kind: tcp, gcs or client); the
    image's Python, no account token, restricted-compliant."""
    containers = []
    for name, (address, env) in attempts.items():
        host, port = address.rsplit(":", 1)
        host = host.removeprefix("ray://")
        containers.append({
            "name": name, "image": image, "imagePullPolicy": "Never",
            "command": ["python", "-c", STRANGER, host, port, address, name.split("-")[0]],
            "env": [{"name": k, "value": v} for k, v in {**env, "TCP_WAIT_S": str(TCP_WAIT_S)}.items()],
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            "resources": {"requests": {"cpu": "10m", "memory": "256Mi"}}})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "stranger", "namespace": namespace, "labels": labels},
            "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False, "containers": containers,
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                         "seccompProfile": {"type": "RuntimeDefault"}}}}
