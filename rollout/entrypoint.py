"""`rlscale rollout --config FILE`: join the run's Ray cluster offering one `rollout` slot."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from rlscale.roles import NO_LOG_MONITOR, ROLLOUT_RESOURCE, ray_auth_env, ray_executable, ray_node_env


def ray_start_command(ray_address: str, num_cpus: int = 0, object_store_bytes: int | None = None) -> list[str]:
    """The `ray start` line of a rollout worker; Serve places one replica per `rollout` slot."""
    return [
        ray_executable(),
        "start",
        f"--address={ray_address}",
        f"--resources={json.dumps({ROLLOUT_RESOURCE: 1})}",
        # Replicas ask for num_cpus=0: the node's CPUs stay free for vLLM's own threads,
        # and on one machine the head already offers the CPUs once.
        f"--num-cpus={num_cpus}",
        "--disable-usage-stats",
        NO_LOG_MONITOR,
        "--block",
        # Sized by the run config to fit the pod's memory-backed /dev/shm.
        *([f"--object-store-memory={int(object_store_bytes)}"] if object_store_bytes else []),
    ]


HEAD_WAIT_S = 600.0  # how long a rollout pod waits for its run's Ray head before it gives up


def wait_for_head(address: str, timeout: float = HEAD_WAIT_S, poll: float = 2.0) -> bool:
    """Wait until the Ray head's GCS port (host:port) accepts a TCP connection. The rollout pods
    start beside the head's pod: joining before it listens made `ray start` fail and the pod
    restart, a restart the run's failure budget counted; waiting here costs none."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=min(poll, 5.0)).close()
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)


# A rollout pod that sees its head replaced leaves this long after: rank 0's own watch (every 10 s)
# goes first, so its driver exits for a restart that says why, instead of failing a step on its
# retries against replicas that are gone (5 retries, about 6 s; rollout/serve.py).
LEAVE_AFTER_S = 15.0


def watch_head(address: str, node: subprocess.Popen, stopping: list, exit_fn=None, make_watch=None,
               retry_s: float = 10.0, leave_after_s: float = LEAVE_AFTER_S):
    """Watch the run's Ray head as rank 0 does (rlscale.trainer.gang.HeadWatch), once its GCS answers: a
    head replaced by a new pod is a new cluster this node is not part of, which `ray start --block`
    noticed only when its raylet gave up on the lost GCS, at Ray's 60 s reconnect timeout, and the
    run's new driver waited that long for a replica slot (tests/node/test_faults_k8s.py, the Ray head
    killed). The watch ends this process with EXIT_GANG `leave_after_s` after it saw the new head; its
    node goes with it (this process is the container's PID 1, so the kernel kills the rest) and the
    restarted container joins the new head. A stop asked for, or a node that has ended, wins. Returns
    the watch."""
    from rlscale.trainer.gang import HeadWatch

    def leave(code: int) -> None:
        time.sleep(leave_after_s)
        if not stopping and node.poll() is None:
            (exit_fn or os._exit)(code)
    watch = (make_watch or HeadWatch.for_address)(address, exit_fn=leave)

    def start() -> None:
        while not stopping and node.poll() is None:
            try:
                return watch.start()
            except Exception:  # the GCS does not answer yet (the node is still joining)
                time.sleep(retry_s)
    threading.Thread(target=start, name="ray-head-watch-start", daemon=True).start()
    return watch


def main(config_path: str | None = None) -> int:
    """Run a Ray worker node until killed (config from the path or $RLSCALE_CONFIG); returns its exit status."""
    # Stops are handled from the start: the pod's process is PID 1, which the kernel spares every signal it
    # has no handler for, so a SIGTERM before the node started was lost and the pod sat out its whole grace
    # period (ROLLOUT_GRACE_S) before the kubelet's SIGKILL: a run failing at once kept its rollout pod
    # Terminating for 3 minutes (tests/node/test_quickstart_k8s.py, bad-reward's pods). Before the node
    # starts there is nothing to drain: the process exits at once; after, the signal goes to the node.
    node: list[subprocess.Popen] = []
    stopping: list[int] = []
    starting = [False]  # the node's process is being started: a stop is passed on once it is there

    def on_stop(signum, _frame):
        stopping.append(signum)
        if node:
            if node[0].poll() is None:
                node[0].send_signal(signal.SIGTERM)
        elif not starting[0]:
            raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    from rlscale.runconfig import load_run_config
    from rlscale.spec import SpecError

    try:
        config = load_run_config(config_path)
    except SpecError as exc:
        print(f"rlscale rollout: {exc}", file=sys.stderr)
        return 2
    # A GPU run: fail here, naming the cause (no GPU visible, driver older than R580), not later inside vLLM.
    from rlscale.gpu_preflight import preflight_exit_code

    if rc := preflight_exit_code(config.spec.hardware.accelerator, config.spec.rollout.gpus_per_replica, "rollout"):
        return rc
    address = config.ray_address or os.environ.get("RAY_ADDRESS")
    if not address:
        print(
            f"{config_path}: ray_address is empty; the run's Ray head address (host:port) "
            "is needed (set it in the run config or RAY_ADDRESS)",
            file=sys.stderr,
        )
        return 2
    if not wait_for_head(address):
        print(f"rlscale rollout: the run's Ray head at {address} did not accept connections within "
              f"{HEAD_WAIT_S:.0f} s; is the ray-head pod running (kubectl get pods -l rlscale.dev/role=ray-head)?",
              file=sys.stderr)
        return 1
    cmd = ray_start_command(address, object_store_bytes=config.object_store_bytes)
    # `ray start --block` stops its raylet and workers on SIGTERM; on_stop passes ours on so that
    # killing this process (the runner's or the kubelet's way) leaves nothing behind.
    starting[0] = True
    proc = subprocess.Popen(cmd, env=ray_node_env())
    node.append(proc)
    if stopping:  # a stop while it was being started
        proc.send_signal(signal.SIGTERM)
    os.environ.update(ray_auth_env())  # the watch's GCS calls need the run's token, as the node's do
    watch = watch_head(address, proc, stopping)
    rc = proc.wait()
    watch.stop()
    # Being told to stop is how this role is meant to end (ray exits 1 on SIGTERM);
    # anything else means the node died under us.
    return 0 if stopping else rc


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--config":
        print("usage: python -m rlscale.rollout.entrypoint --config FILE", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(sys.argv[2]))
