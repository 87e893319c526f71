"""Where rank 0's loop runs: on one machine (`rlscale run`: the driver re-plans itself, serves /metrics on
loopback, ends by exiting) or in a pod (the operator re-plans; the driver reports progress to its RLRun,
serves /metrics to the cluster, and at the end waits to be scaled to zero). One object says which, so the
loop itself never asks `if local`."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

from rlscale.cpu_split import available_cpus
from rlscale.kube_report import KubeTarget, ProgressReporter
from rlscale.progress_report import ProgressReport
from rlscale.records import StepRecord
from rlscale.roles import RunEnd, ray_auth_env
from rlscale.runconfig import ENV_CONFIG, RunConfig
from rlscale.trainer import stops
from rlscale.trainer.driver import Driver, permanent
from rlscale.trainer.plan_source import FixedPlan, FollowOperator, PlanSource, Replanner
from rlscale.trainer.sinks import KubeSink, Sink

log = logging.getLogger("rlscale.driver")


class LocalEnvironment:
    """`rlscale run` and `rlscale sweep`: processes of this machine, started and stopped by the runner."""

    metrics_addr = "127.0.0.1"

    def __init__(self, cfg: RunConfig):
        self.options = cfg.local

    def replica_metrics_port(self, cfg: RunConfig) -> int | None:
        return None  # locally no replica serves /metrics of its own

    def plan_source(self, cfg: RunConfig) -> PlanSource:
        if not self.options.replan:
            return FixedPlan()
        k, host_cores = self.options.staleness, 0
        if cfg.spec.hardware.accelerator == "cpu":
            # The cores were split (or not) at the start for the plan's staleness, and the processes stay
            # pinned: a re-plan keeps that staleness, and predicts each side on the cores it has.
            k = cfg.the_plan().staleness if k is None else k
            # This process is pinned to the learner's cores: the host's are both sides' together.
            split = self.options.cores()
            host_cores = sum(split.values()) if split else len(available_cpus())
        return Replanner(cfg.spec, staleness=k, host_cores=host_cores)

    def sinks(self, cfg: RunConfig, report_location: str) -> list[Sink]:
        return []

    def finish(self, end: RunEnd, client: Any, learner: Any) -> None:
        if self.options.linger_seconds > 0:
            time.sleep(self.options.linger_seconds)  # a scraper's last look at the final values

    def release(self, client: Any) -> None:
        # The runner kills the run's whole Ray cluster next: deleting the Serve app first (the
        # replica's graceful stop, the engine's teardown) only delayed that.
        pass


class PodEnvironment:
    """A learner pod: the operator re-plans and scales; the driver reports progress to its RLRun."""

    metrics_addr = "0.0.0.0"

    def replica_metrics_port(self, cfg: RunConfig) -> int | None:
        # Each replica serves /metrics on the port its pod declares: the rollout pod's metrics port,
        # or colocated, the learner pod's next one (its local rank 0 serves the metrics port).
        colocated = getattr(cfg.the_plan(), "placement", "disaggregated") == "colocated"
        return cfg.metrics_port + 1 if colocated else cfg.metrics_port

    def plan_source(self, cfg: RunConfig) -> PlanSource:
        return FollowOperator(os.environ.get(ENV_CONFIG))

    def sinks(self, cfg: RunConfig, report_location: str) -> list[Sink]:
        target = KubeTarget.in_cluster(cfg.run, cfg.namespace)
        return [KubeSink(ProgressReporter(target), report_location)] if target else []

    def finish(self, end: RunEnd, client: Any, learner: Any) -> None:
        if end in (RunEnd.TARGET, RunEnd.BUDGET):
            # The run has ended. Exiting would make the StatefulSet start it again; the operator
            # scales the run to zero instead. Free the replicas and the other ranks now, and keep
            # /metrics up (the final values) until the kubelet's SIGTERM.
            client.shutdown()
            learner.shutdown()
            wait_for_termination()

    def release(self, client: Any) -> None:
        client.shutdown()


def environment(cfg: RunConfig) -> LocalEnvironment | PodEnvironment:
    return LocalEnvironment(cfg) if cfg.local is not None else PodEnvironment()


def report_location(cfg: RunConfig) -> str:
    """Where the report lives, as a person finds it: this pod's volume and the path in it."""
    path = os.path.realpath(cfg.report_dir or ".")
    pod = os.environ.get("POD_NAME")
    return f"{path} on {pod}" if pod else path


def report_failure(exc: BaseException, last_record: StepRecord | None = None) -> bool:
    """Tell the operator why rank 0 stops (in a pod; elsewhere a no-op). Returns True if sent."""
    target = KubeTarget.in_cluster()
    if target is None:
        return False
    body = ProgressReport.failure(last_record, f"{type(exc).__name__}: {exc}", permanent=permanent(exc))
    return ProgressReporter(target).report(body, force=True)


def wait_for_termination() -> None:
    """Block until SIGTERM or SIGINT (the kubelet's stop); return at once when one came already
    (trainer/stops.py: the kubelet sends one)."""
    from rlscale.trainer.gang import stop_head_watches

    done = threading.Event()
    for sig in stops.SIGNALS:
        signal.signal(sig, stops.noted(lambda *_: done.set()))
    if stops.STOPS:
        log.info("run finished; already told to stop")
        return
    log.info("run finished; waiting to be scaled to zero")
    stop_head_watches()
    done.wait()


def install_stop_handlers(driver: Driver) -> None:
    """SIGTERM/SIGINT: finish the current step, checkpoint, exit 130."""
    for sig in stops.SIGNALS:
        signal.signal(sig, stops.noted(driver.request_stop))


# The planner's share of each rollout GPU (AcceleratorProfile.memory_utilization) when neither the spec
# nor the plan names one.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9


def rollout_placement(spec: Any, plan: Any) -> str:
    """Colocated or disaggregated: the plan's choice, else the spec's explicit one, else disaggregated."""
    chosen = getattr(plan, "placement", None) if plan is not None else None
    if chosen in ("colocated", "disaggregated"):
        return chosen
    asked = getattr(spec, "placement", "auto")
    return asked if asked in ("colocated", "disaggregated") else "disaggregated"


def rollout_memory_utilization(spec: Any, plan: Any) -> float:
    """The engine's gpu_memory_utilization: rollout.gpuMemoryUtilization, else the plan's, else 0.9."""
    asked = getattr(spec.rollout, "gpu_memory_utilization", None)
    if asked:
        return float(asked)
    planned = getattr(plan, "rollout_memory_utilization", None) if plan is not None else None
    return float(planned) if planned else DEFAULT_GPU_MEMORY_UTILIZATION


def engine_gpus(cfg: RunConfig) -> int:
    """GPUs of one engine (its tensor-parallel degree): the plan's, which colocated is the learner pod's
    GPUs; rollout.gpusPerReplica for a plan written before plans said."""
    if cfg.spec.hardware.accelerator == "cpu":
        return 0
    return max(1, int(getattr(cfg.plan, "tensor_parallel", 0) or cfg.spec.rollout.gpus_per_replica))


def engine_lora(spec) -> dict | None:
    """EngineConfig.lora: with spec.lora the engines serve the base with vLLM's LoRA and take adapters; with
    modulesToSave they take merged weights like a full update (trainer/lora/policy.py, sync_mode)."""
    lo = getattr(spec, "lora", None)
    if lo is None or lo.modules_to_save:
        return None
    return {"rank": lo.rank, "alpha": lo.alpha if lo.alpha is not None else lo.rank}


def rollout_engine_config(cfg: RunConfig):
    """The rollout replicas' EngineConfig from the spec and the plan. On a GPU accelerator: one replica's
    rollout.gpusPerReplica GPUs as vLLM tensor parallelism, the memory share the planner assumed, and
    sleep mode when the rollout is colocated with the learner. On accelerator cpu none of them applies."""
    from rlscale.plan.placement import transfer_backend
    from rlscale.rollout.engine import EngineConfig

    spec = cfg.spec
    backend = transfer_backend(spec.hardware.accelerator, rollout_placement(spec, cfg.plan))
    engine = EngineConfig(model=str(cfg.model_dir), dtype=spec.model.dtype, max_model_len=spec.model.max_length,
                          seed=cfg.seed, transfer_backend=backend, lora=engine_lora(spec))
    if spec.hardware.accelerator != "cpu":
        engine.tensor_parallel_size = engine_gpus(cfg)
        engine.gpu_memory_utilization = rollout_memory_utilization(spec, cfg.plan)
        engine.enable_sleep_mode = rollout_placement(spec, cfg.plan) == "colocated"
    # the sequences a replica decodes at once in the plan (its KV cap); plans written before it: vLLM's default
    if int(getattr(cfg.plan, "max_num_seqs", 0) or 0) > 0:
        engine.max_num_seqs = int(cfg.plan.max_num_seqs)
    return engine


def connect_rollout(cfg: RunConfig):
    """Join the run's Ray cluster and deploy its rollout replicas; returns once they serve."""
    os.environ.update(ray_auth_env())  # read by Ray at import
    import ray

    from rlscale.rollout.serve import RolloutClient, RolloutOptions

    ray.init(address=cfg.ray_address, namespace=f"rlscale-{cfg.run}", log_to_driver=False,
             logging_level=logging.WARNING)
    engine = rollout_engine_config(cfg)
    local = cfg.local
    if local is not None and local.rollout_cpu_threads:
        # The local runner knows how many cores each replica may use; a pod keeps the default.
        engine.cpu_threads = int(local.rollout_cpu_threads)
    # A rollout app kept across runs (rlscale sweep's shared nodes): a run attaches to its
    # replicas when the engine settings match, and replaces their weights.
    kept = local.rollout_app if local is not None else None
    return RolloutClient.deploy(engine, RolloutOptions(
        app_name=kept or f"rollout-{cfg.run}", num_replicas=cfg.the_plan().rollout_replicas, keep=bool(kept),
        metrics_port=environment(cfg).replica_metrics_port(cfg),
        num_gpus=float(engine_gpus(cfg))))


def drive(cfg: RunConfig, learner, client=None, probe=None) -> int:
    """Rank 0's whole job: connect to the run's Ray cluster, deploy rollout, run the loop, clean up.

    `client`: a RolloutClient from connect_rollout, when rank 0 deployed it beside the learner's start-up.
    `probe`: the pod's probe server (rlscale.rollout.readiness), which then serves the driver's /metrics.
    """
    os.environ.update(ray_auth_env())  # read by Ray at import
    import ray
    from transformers import AutoTokenizer

    env = environment(cfg)
    tok = AutoTokenizer.from_pretrained(cfg.model_dir, local_files_only=True)
    if client is None:
        client = connect_rollout(cfg)
    driver = Driver.from_config(cfg, learner, client, tok, env.sinks(cfg, report_location(cfg)), env.plan_source(cfg))
    pids = sorted(i.get("pid") for i in client.replicas().values())
    log.info("rollout app %s: %s, replica pids %s", client.options.app_name,
             "attached to its running replicas (kept from an earlier run)" if client.attached else "deployed", pids)
    driver.resume_or_start()
    if client.published_version is not None and client.published_version >= driver.state.version:
        # The Ray cluster outlived an earlier driver: versions only move forward.
        driver.state.version = client.published_version + 1
    install_stop_handlers(driver)
    if probe is not None:  # the pod's server, up since the process started, takes the driver's metrics
        probe.serve_registry(driver.metrics.registry)
        server = None
    else:
        server = driver.metrics.serve(cfg.metrics_port, addr=env.metrics_addr)
    try:
        end = driver.run()
        env.finish(end, client, learner)
    finally:
        try:
            env.release(client)
        finally:
            ray.shutdown()
            if server is not None and isinstance(server, tuple):
                server[0].shutdown()
    return int(end)
