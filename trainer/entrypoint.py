"""`rlscale learner --config FILE`: one DeepSpeed rank; rank 0 drives the run, the others follow.

With LOCAL_WORLD_SIZE > 1 (a pod of several ranks, spec.learner.ranksPerReplica) the process is the
pod's launcher instead (trainer/launcher.py), which starts that many ranks of this same entrypoint.
In a pod, local rank 0 serves the pod's /ready (ready when every local rank is) and /metrics on the
pod's metrics port and starts the pod's Ray node; the other local ranks answer /ready on loopback
ports of their own (local_probe_port) and bind nothing else.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

log = logging.getLogger("rlscale.learner")


def resolve_model_dir(cfg, progress: bool = False) -> str:
    """The model directory every role of the run uses: the runner's, else resolved in the model
    volume (builtin models built there once, hub ids from its Hugging Face cache)."""
    from rlscale.trainer.builtin import resolve_model_path

    if cfg.model_dir:
        return str(cfg.model_dir)
    spec = cfg.spec
    return str(resolve_model_path(spec.model.path, cache_dir=cfg.model_cache, progress=progress,
                                  download=spec.model.download))


def learner_config_from_run(cfg):
    """The LearnerConfig for a resolved run config (spec + plan + model directory)."""
    from rlscale.trainer.learner import LearnerConfig

    return LearnerConfig.from_spec(cfg.spec, resolve_model_dir(cfg), learning_rate=cfg.the_plan().learning_rate,
                                   seed=cfg.seed, checkpoint_dir=cfg.checkpoint_dir)


def prepare_model_main(config_path: str | None) -> int:
    """`rlscale prepare-model`: the pods' init step; prints the model directory, exit 2 naming the fix."""
    from rlscale.runconfig import load_run_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s prepare-model %(message)s", stream=sys.stderr)
    cfg = load_run_config(config_path)
    try:
        path = resolve_model_dir(cfg, progress=True)
    except ValueError as exc:
        print(f"rlscale prepare-model: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def main(config_path: str | None) -> int:
    """Start this rank's learner; rank 0 runs the driver loop, ranks > 0 serve it until it stops.
    In a pod, rank 0 reports an error that stops it to the RLRun before exiting. With several ranks
    a pod (LOCAL_WORLD_SIZE > 1) this process is their launcher."""
    from rlscale.trainer.launcher import is_launcher, launch
    from rlscale.trainer.stops import exit_on_stop

    exit_on_stop()  # a stop before the role's own handlers (trainer/stops.py)
    if is_launcher():
        return launch(learner_argv(config_path))
    try:
        return _main(config_path)
    except Exception as exc:
        if os.environ.get("KUBERNETES_SERVICE_HOST") and int(os.environ.get("RANK", "0")) == 0:
            from rlscale.trainer.driver import permanent
            from rlscale.trainer.run_env import report_failure, wait_for_termination

            report_failure(exc)
            if permanent(exc):
                log.error("rank 0 stopped: %s: %s (the run is Failed; a restart would meet it again)",
                          type(exc).__name__, exc, exc_info=exc)
                # Exiting would restart the pod into the same error: wait for the scale-down.
                wait_for_termination()
                return 1
        raise


def _main(config_path: str | None) -> int:
    from rlscale.runconfig import load_run_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s learner %(levelname)s %(message)s", stream=sys.stderr)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/rlscale/torch_extensions"))
    cfg = load_run_config(config_path)
    # A GPU run: fail here naming the cause (no GPU visible, a driver older than the images need), not
    # later, when DeepSpeed would quietly fall back to the CPU.
    from rlscale.gpu_preflight import preflight_exit_code

    if rc := preflight_exit_code(cfg.spec.hardware.accelerator, cfg.spec.learner.gpus_per_replica, "learner"):
        return rc
    in_pod = cfg.in_pod
    rank, local_rank, local_world = _rank_env()
    # The pod's readiness probe asks /ready from now on: 503 until this rank has joined the gang.
    probe = start_probe_server(cfg.metrics_port, local_rank) if in_pod else None
    if rank == 0:
        check_reward(cfg)
    cfg.model_dir = resolve_model_dir(cfg)  # one lookup for the learner, the tokenizer and the replicas
    if needs_ray_node(in_pod, rank, local_world):
        # The driver reaches Ray through a node of its own (its object store holds the weights it
        # publishes); a process on a host without a Ray node cannot join the cluster. Colocated, each
        # pod's (or launcher's) node also offers the `rollout` slot its Serve replica takes.
        start_ray_node(cfg)
        if in_pod:
            watch_ray_head(cfg)
    # Rank 0 deploys the rollout replicas (Serve, vLLM's load) while DeepSpeed starts: one
    # after the other they took 28 s and 45 s of the quickstart's start-up.
    rollout = _Background(_connect_rollout, cfg) if rank == 0 else None
    from rlscale.trainer.learner import Learner

    learner = Learner(learner_config_from_run(cfg))
    if probe is not None:
        probe.ready_when(pod_ready_check(learner, cfg.metrics_port, local_rank, local_world))
    log.info("rank %d of %d ready (ZeRO stage %d)", learner.rank, learner.world_size, learner.config.zero_stage)
    if learner.rank > 0:
        import signal

        stopping: list[int] = []

        def on_term(signum, _frame):
            # Rank 0 got the same signal: it finishes its step, checkpoints with this rank's
            # help, then releases it. Dying now would break that checkpoint's collectives.
            stopping.append(signum)
            log.info("rank %d: signal %d; waiting for rank 0 to checkpoint and release this rank", learner.rank, signum)

        signal.signal(signal.SIGTERM, on_term)
        if probe is not None:
            # Local ranks > 0 serve theirs on their loopback probe port (not scraped).
            serve_follower_metrics(learner, probe)
        why = learner.follow()
        if why == "failed" and not stopping:
            # Rank 0 stopped on an error and its pod restarts: restart with it, so the gang forms
            # again (waiting here for a scale-down that never comes kept rank 0's new process from
            # ever meeting this rank: tests/node/test_faults_k8s.py, a driver error with 2 learners).
            log.error("rank %d: rank 0 stopped on an error; exiting so the gang restarts", learner.rank)
            return 1
        if in_pod and not stopping:
            # Rank 0 released this rank because the run ended (it drives the exit otherwise);
            # exiting would restart the pod, so wait for the operator's scale-down.
            from rlscale.trainer.run_env import wait_for_termination

            wait_for_termination()
        return 0
    from rlscale.trainer.run_env import drive

    try:
        code = drive(cfg, learner, rollout.result() if rollout else None, probe=probe)
    except BaseException:
        learner.shutdown(failed=True)
        raise
    learner.shutdown()
    return code


def learner_argv(config_path: str | None) -> list[str]:
    """What the launcher starts for each rank: this entrypoint again, with the same config."""
    return [sys.executable, "-m", "rlscale.cli", "learner", *(["--config", config_path] if config_path else [])]


def _rank_env() -> tuple[int, int, int]:
    """(RANK, LOCAL_RANK, LOCAL_WORLD_SIZE) from the environment (one rank a pod by default)."""
    env = os.environ
    return int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0")), int(env.get("LOCAL_WORLD_SIZE") or 1)


def needs_ray_node(in_pod: bool, rank: int, local_world: int = 1) -> bool:
    """Whether this process starts its pod's Ray node: rank 0 in a pod (the driver's node); and,
    where the node offers resources (RAY_RESOURCES_ENV: colocated rollout), the first rank of every
    pod or local learner process (rank % LOCAL_WORLD_SIZE == 0), in a pod or not. Locally rank 0
    otherwise uses the nodes already there."""
    if rank % max(1, local_world) != 0:
        return False
    return (in_pod and rank == 0) or bool(os.environ.get(RAY_RESOURCES_ENV))


def local_probe_port(metrics_port: int, local_rank: int) -> int:
    """Where a pod's local rank answers /ready: local rank 0 on the pod's metrics port (every
    interface: the kubelet's probe, the scrape), the others on loopback ports of their own."""
    return metrics_port if local_rank == 0 else metrics_port + LOCAL_PROBE_OFFSET + local_rank


LOCAL_PROBE_OFFSET = 100  # local rank r > 0 answers on metrics port + 100 + r (loopback)


def start_probe_server(port: int, local_rank: int = 0):
    """The pod's /ready and /metrics on the port every learner pod declares, up from the process's
    start; /ready answers 503 until ready_when names the check (rlscale.rollout.readiness). Local
    ranks > 0 answer on loopback only, for local rank 0's check."""
    from rlscale.rollout.readiness import ProbeServer

    return ProbeServer(local_probe_port(port, local_rank), addr="0.0.0.0" if local_rank == 0 else "127.0.0.1")


def pod_ready_check(learner, metrics_port: int, local_rank: int, local_world: int):
    """The probe's check: this rank is in the gang; local rank 0's also asks every other local
    rank of the pod, so the pod is Ready only once all its ranks are."""
    if local_rank != 0 or local_world <= 1:
        return lambda: in_gang(learner)
    ports = [local_probe_port(metrics_port, r) for r in range(1, local_world)]
    return lambda: in_gang(learner) and all(_peer_ready(p) for p in ports)


def _peer_ready(port: int, timeout: float = 0.5) -> bool:
    import urllib.error
    import urllib.request

    from rlscale.rollout.readiness import READY_PATH

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{READY_PATH}", timeout=timeout) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


def in_gang(learner) -> bool:
    """Whether this rank takes part in the training: the Learner is built (torch.distributed
    initialised, the DeepSpeed engine built, every rank past the start barrier) and rank 0 has not
    released the gang (the run's end). A rank that exits for a gang restart answers nothing, and
    its restarted process answers 503 until it has joined again."""
    import torch.distributed as dist

    return dist.is_initialized() and not learner.gang.stopped


def serve_follower_metrics(learner, probe) -> None:
    """Ranks > 0 serve /metrics on the pod's probe server: the optimiser steps this rank has
    applied (a rank behind rank 0's rlscale_steps_total is stuck or restarted)."""
    from prometheus_client import CollectorRegistry, Gauge

    from rlscale.metrics_names import PREFIX

    reg = CollectorRegistry()
    Gauge(f"{PREFIX}learner_rank_steps", "Learner steps (batches trained) this learner rank has applied.", ["rank"],
          registry=reg).labels(str(learner.rank)).set_function(lambda: learner.steps)
    probe.serve_registry(reg)


def check_reward(cfg) -> None:
    """Import the spec's reward before anything starts: a reward that does not import fails the
    run at once, naming it, instead of after the learner and the replicas have come up."""
    from rlscale.trainer.driver import PermanentRunError
    from rlscale.trainer.rewards import resolve_reward

    try:
        t = cfg.spec.task
        resolve_reward(t.reward, format_pattern=t.format_pattern, timeout_s=t.reward_timeout)
    except ValueError as exc:
        raise PermanentRunError(str(exc)) from exc


# JSON of the Ray resources the pod's node offers (the operator sets {"rollout": 1} on a colocated
# run's learner pods, the local runner on its learner launchers): Serve places a replica there.
RAY_RESOURCES_ENV = "RLSCALE_RAY_RESOURCES"


def ray_node_command(cfg) -> list[str]:
    """`ray start` of the pod's node: daemonised, no CPUs, and the resources RAY_RESOURCES_ENV names."""
    from rlscale.roles import NO_LOG_MONITOR, ray_executable

    cmd = [ray_executable(), "start", f"--address={cfg.ray_address}", "--num-cpus=0", "--disable-usage-stats",
           NO_LOG_MONITOR]
    if os.environ.get(RAY_RESOURCES_ENV):
        cmd.append(f"--resources={os.environ[RAY_RESOURCES_ENV]}")
    if cfg.object_store_bytes:
        cmd.append(f"--object-store-memory={int(cfg.object_store_bytes)}")
    return cmd


def start_ray_node(cfg) -> None:
    """`ray start` (a daemonised node offering no CPUs) joining the run's head, for the driver."""
    import subprocess

    cmd = ray_node_command(cfg)
    log.info("starting this pod's Ray node: %s", " ".join(cmd))
    deadline = time.monotonic() + 300  # the head's pod may still be starting
    while True:
        done = subprocess.run(cmd, env=learner_node_env(), stdout=sys.stderr, stderr=sys.stderr)
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"could not join the run's Ray head at {cfg.ray_address} within 300 s "
                               f"(`ray start` exit {done.returncode}); is the ray-head pod running?")
        time.sleep(5)


def learner_node_env() -> dict[str, str]:
    """The learner pod's Ray node without Ray's memory monitor (unless the environment sets it): the
    pod's memory is the learner process's, and near the container's limit the monitor killed the
    run's WeightStore actor, a bystander of a few MB, so the driver failed with a Ray error where
    the kernel would have OOM-killed the learner and Kubernetes said OOMKilled
    (tests/node/test_faults_k8s.py, rank 0 grown to 3.58 GB in a 4Gi container)."""
    from rlscale.roles import ray_node_env

    env = ray_node_env()
    env.setdefault("RAY_memory_monitor_refresh_ms", "0")
    return env


def watch_ray_head(cfg) -> None:
    """Exit for a restart when the run's Ray head is replaced (rlscale.trainer.gang.HeadWatch)."""
    from rlscale.roles import ray_auth_env
    from rlscale.trainer.gang import HeadWatch

    os.environ.update(ray_auth_env())
    HeadWatch.for_address(cfg.ray_address).start()


def _connect_rollout(cfg):
    from rlscale.trainer.run_env import connect_rollout

    return connect_rollout(cfg)


class _Background:
    """Run fn(*args) in a daemon thread: a start-up that fails elsewhere does not wait for it."""

    def __init__(self, fn, *args):
        self._value = self._error = None
        self._thread = threading.Thread(target=self._run, args=(fn, *args), name="rollout-deploy", daemon=True)
        self._thread.start()

    def _run(self, fn, *args):
        try:
            self._value = fn(*args)
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
