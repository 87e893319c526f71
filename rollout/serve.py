"""Ray Serve deployment of the rollout engine, the weight store, and the driver's client."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# On 2 shared cores the router's 0.1 s queue-length probe times out under bursts and
# floods the log; the router lives in the calling process, so set it before import.
os.environ.setdefault("RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S", "1.0")

import ray  # noqa: E402
from ray import serve  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from rlscale.metrics_names import ROLLOUT_PREFIX  # noqa: E402
from rlscale.roles import ROLLOUT_RESOURCE  # noqa: E402
from rlscale.rollout.engine import EngineConfig, Sample, prompt_seeds  # noqa: E402
from rlscale.rollout.placement import ServingState, here, hosting_pods, live, serve_actor_names  # noqa: E402
from rlscale.rollout.replica_sync import WeightStore, wait_for_version  # noqa: E402
from rlscale.rollout.transfer.buckets import DEFAULT_BUCKET_BYTES  # noqa: E402
from rlscale.rollout.transfer.control import Member, ReplicaClient, ReplicaCommands  # noqa: E402

log = logging.getLogger(__name__)

APP_NAME = "rlscale-rollout"
DEPLOYMENT_NAME = "RolloutReplica"
STORE_NAMESPACE = "rlscale"  # Serve replicas live in the "serve" namespace: name it
# Seconds a replica Serve removes (a scale-down, a draining node) gets to finish its in-flight
# requests. The operator sizes the rollout pods' drain and grace period from the same figure
# (rlscale.operator.constants.ROLLOUT_GRACEFUL_SHUTDOWN_S; tests/rollout/test_scaling.py checks it).
GRACEFUL_SHUTDOWN_S = 120.0

# Errors that mean "the replica went away", not "the request is bad": retry elsewhere.
_RETRYABLE = (
    ray.exceptions.RayActorError,  # ActorDiedError, ActorUnavailableError
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.NodeDiedError,
    ray.exceptions.ObjectLostError,
)


def store_name(app_name: str) -> str:
    return f"{app_name}-weights"


@dataclass
class GenerateRequest:
    """One chunk of prompts for one replica; seeds are per prompt so chunking is invisible."""

    prompt_token_ids: list[list[int]]
    seeds: list[int] | None
    samples_per_prompt: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    min_version: int = 0
    stop_token_ids: list[int] | None = None
    top_k: int | None = None  # None: vLLM's default (off), as the spec's unset knobs
    min_p: float | None = None
    repetition_penalty: float | None = None

    def sampling_key(self) -> tuple:
        stops = None if self.stop_token_ids is None else tuple(self.stop_token_ids)
        seeded = self.seeds is not None  # seeded and unseeded requests run apart
        return (self.samples_per_prompt, self.temperature, self.top_p, self.max_new_tokens, stops, seeded,
                self.top_k, self.min_p, self.repetition_penalty)


class RolloutReplica:
    """A Serve replica: one engine, kept at or ahead of the version each request needs."""

    def __init__(
        self,
        engine_config: dict[str, Any],
        store: str,
        initial_version: int = 0,
        metrics_port: int | None = None,
        version_wait_s: float = 60.0,
    ):
        from rlscale.rollout.engine import RolloutEngine
        from rlscale.rollout.metrics import RolloutMetrics

        self.metrics = RolloutMetrics()
        self.store = ray.get_actor(store, namespace=STORE_NAMESPACE)
        self.replica_id = _replica_id()
        # Its pod hosts a replica from now on (the engine's load takes the longest): the operator
        # removes no pod the register names (rlscale.rollout.placement).
        self.where = {**here(_actor_name()), "node_id": ray.get_runtime_context().get_node_id(),
                      "pid": os.getpid(), "serving": False}
        ray.get(self.store.register.remote(self.replica_id, self.where))
        self.engine = RolloutEngine(engine_config, version=initial_version)
        self.version_wait_s = version_wait_s
        # Weights arrive through vLLM's weight transfer engines, each phase posted by the driver's publisher
        # (rlscale.rollout.transfer): this thread carries them out, and sleep/wake of colocated placement.
        self.commands = ReplicaCommands(self.store, self.replica_id, self.engine, on_version=self._loaded).start()
        self.metrics.weights_version.set(self.engine.version)
        self._metrics_server = None
        # True from the end of construction (engine loaded, newest weights in, registered) until a
        # graceful stop: the pod's readiness probe asks /ready on the metrics port.
        self.serving = False
        url = None
        if metrics_port is not None:
            from rlscale.rollout.readiness import ProbeServer

            self._metrics_server = ProbeServer(metrics_port, registry=self.metrics.registry,
                                               check=lambda: self.serving)
            url = f"http://{ray.util.get_node_ip_address()}:{self._metrics_server.server_port}/metrics"
        # Ready: the next publish includes this replica (a group of the replicas ready then). Until it lands,
        # the replica holds the model directory's weights, and requests that need newer ones wait.
        workers = int(self.engine.config.tensor_parallel_size)
        info = {**self.where, "serving": True, "ready": True, "workers": workers,
                "start_version": self.engine.version, "version": self.engine.version, "metrics_url": url}
        ray.get(self.store.register.remote(self.replica_id, info))
        self.serving = True

    def _loaded(self, version: int, stats: dict[str, Any]) -> None:
        self.metrics.weights_version.set(version)
        seconds = float((stats or {}).get("seconds") or 0.0)
        self.metrics.weight_load_seconds.observe(seconds)
        self.store.loaded.remote(self.replica_id, version, seconds)

    def _sync(self, need: int) -> None:
        """Wait until this replica holds weights version `need` (the driver's publish brings it)."""
        wait_for_version(self.engine, need, self.version_wait_s)

    async def generate(self, request: dict[str, Any]) -> list[list[Sample]]:
        self.metrics.requests_in_flight.inc()
        try:
            return await self._generate_batch(GenerateRequest(**request))
        finally:
            self.metrics.requests_in_flight.dec()

    # Requests that arrive while the engine is busy are merged into its next call, so
    # many small requests still make one large vLLM batch.
    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.005)
    async def _generate_batch(self, requests: list[GenerateRequest]) -> list[list[list[Sample]]]:
        return await asyncio.to_thread(self._run_batch, requests)

    def _run_batch(self, requests: list[GenerateRequest]) -> list[list[list[Sample]]]:
        self._sync(max(r.min_version for r in requests))
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(r.sampling_key(), []).append(i)
        results: list[list[list[Sample]]] = [[] for _ in requests]
        for idxs in groups.values():
            first = requests[idxs[0]]
            prompts = [p for i in idxs for p in requests[i].prompt_token_ids]
            seeds = None
            if first.seeds is not None:
                seeds = [s for i in idxs for s in requests[i].seeds]
            t0 = time.perf_counter()
            out = self.engine.generate(
                prompts,
                samples_per_prompt=first.samples_per_prompt,
                temperature=first.temperature,
                top_p=first.top_p,
                max_new_tokens=first.max_new_tokens,
                seed=seeds,
                stop_token_ids=first.stop_token_ids,
                top_k=first.top_k,
                min_p=first.min_p,
                repetition_penalty=first.repetition_penalty,
            )
            tokens = sum(len(s.token_ids) for group in out for s in group)
            self.metrics.observe_generation(
                time.perf_counter() - t0, sum(len(g) for g in out), tokens
            )
            pos = 0
            for i in idxs:
                n = len(requests[i].prompt_token_ids)
                results[i] = out[pos : pos + n]
                pos += n
        return results

    async def weights_version(self) -> int:
        return self.engine.version

    async def info(self) -> dict[str, Any]:
        """Who answered: for tests and for the driver's logs."""
        return {"replica": self.replica_id, "pid": os.getpid(), "version": self.engine.version}

    async def weights_digest(self) -> dict[str, Any]:
        """Who answered, its weights version, and a hash of its model's parameters (tests compare them)."""
        from rlscale.rollout.replica_sync import model_digest

        with self.engine._lock:
            digest = self.engine.llm.collective_rpc(model_digest)[0]
        return {"replica": self.replica_id, "version": self.engine.version, "digest": digest}

    async def metrics_text(self) -> bytes:
        return self.metrics.text()

    def __del__(self):
        # Serve calls this on a graceful stop (scale-down); a crashed replica stays
        # registered, so readers also check that the process lives.
        self.serving = False
        if getattr(self, "commands", None) is not None:
            self.commands.stop()
        server = getattr(self, "_metrics_server", None)
        if server is not None:
            server.shutdown()
        try:
            ray.get(self.store.unregister.remote(self.replica_id), timeout=5)
        except Exception:  # the store or Ray may already be gone at shutdown
            pass


def attach_key(engine_config: Mapping[str, Any]) -> dict[str, Any]:
    """The engine settings a kept app must match to be reused: all but the engine's seed, which no
    request depends on (sampling requests carry a seed per prompt, evaluations are greedy)."""
    return {k: v for k, v in engine_config.items() if k != "seed"}


def _replica_id() -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # constructed outside Serve (direct use in tests or tools)
        return f"pid-{os.getpid()}"


def _actor_name() -> str | None:
    """The name Serve gave this replica's actor (Ray drops it once the actor is dead)."""
    try:
        return serve.get_replica_context().replica_id.to_full_id_str()
    except Exception:  # constructed outside Serve
        return None


@dataclass
class RolloutOptions:
    """Placement and request shaping of the rollout application."""

    app_name: str = APP_NAME
    num_replicas: int = 1
    # {"rollout": 1} pins one replica per rollout pod or `rlscale rollout` process.
    resources: dict[str, float] = field(default_factory=lambda: {ROLLOUT_RESOURCE: 1.0})
    # CPU replicas would otherwise reserve Ray's CPUs and not fit beside the learner.
    num_cpus: float = 0.0
    num_gpus: float = 0.0
    max_ongoing_requests: int = 64
    requests_per_replica: int = 2  # chunks per replica and call; merged by serve.batch
    max_retries: int = 5
    request_timeout_s: float = 900.0
    metrics_port: int | None = None  # 0: an ephemeral port per replica
    initial_version: int = 0
    version_wait_s: float = 60.0
    graceful_shutdown_timeout_s: float = GRACEFUL_SHUTDOWN_S  # let in-flight batches finish on scale-down
    drain_margin_s: float = 30.0  # a scale-down waits this long past the graceful timeout, then reports
    # The app and its weight store outlive this client (the store is detached): a later client
    # with the same app name and engine settings attaches to the running replicas instead of
    # starting new ones, and its first publish replaces the weights (rlscale sweep's runs).
    keep: bool = False
    # Weights through vLLM's weight transfer engines (rlscale.rollout.transfer): the backend is the engine
    # config's transfer_backend; a bucket is the most a receiver holds at once.
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    sync_timeout_s: float = 120.0  # any one phase of a transfer (a member that died mid-update)


class RolloutClient:
    """The driver's side: deploy, scale, publish weights, generate with retries."""

    def __init__(self, engine_config: EngineConfig | Mapping[str, Any], options: RolloutOptions | None = None):
        if isinstance(engine_config, EngineConfig):
            engine_config = asdict(engine_config)
        self.engine_config = dict(engine_config)
        self.options = options or RolloutOptions()
        if not self.engine_config.get("transfer_backend"):
            # Disaggregated replicas on this accelerator: nccl on GPUs, its gloo stand-in on CPU.
            from rlscale.plan.placement import transfer_backend

            self.engine_config["transfer_backend"] = transfer_backend(
                "gpu" if self.options.num_gpus else "cpu", "disaggregated")
        self._store = None
        self._handle = None
        self._published: int | None = None
        self._publisher: Any = None  # rlscale.trainer.transfer.publisher.WeightPublisher
        self._tensors: Any = None  # what publish_weights sends when given tensors, not a source
        # A sender that can catch a replica up (the driver's publish of the version it holds), called before a
        # request goes out while a ready replica is behind: a restarted replica would otherwise wait for a
        # publish that waits for its requests. None where the trainer may be busy (generation ahead).
        self.on_behind: Any = None
        self.last_sync: Any = None  # what the newest publish did (its SyncResult)
        self.retries = 0  # requests resent after their replica died
        self.attached = False  # deploy() found a kept app with this engine and used its replicas
        self._retries_lock = threading.Lock()
        self._behind_lock = threading.Lock()

    @classmethod
    def deploy(
        cls, engine_config: EngineConfig | Mapping[str, Any], options: RolloutOptions | None = None
    ) -> RolloutClient:
        """Create the weight store and the Serve application (ray must be initialised)."""
        client = cls(engine_config, options)
        # On the caller's own node: the store holds refs to weights the caller put in that node's
        # object store, and Ray may otherwise place a num_cpus=0 actor on a replica's node, where
        # losing that one rollout pod took the store, then the driver, down with it (seen on the
        # real node: ActorDiedError "WeightStore ... its node has died" at the next publish).
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        o = client.options
        client._store = WeightStore.options(
            name=store_name(o.app_name), namespace=STORE_NAMESPACE, get_if_exists=True,
            scheduling_strategy=here, **({"lifetime": "detached"} if o.keep else {}),
        ).remote()
        client._published = ray.get(client._store.version.remote())
        serve.start(proxy_location="Disabled")
        if o.keep and client._attach():
            return client
        client._run(o.num_replicas)
        if o.keep:
            ray.get(client._store.set_engine.remote(attach_key(client.engine_config)))
        return client

    def _attach(self) -> bool:
        """Use the kept app when it runs the same engine; scale it to this client's replica count."""
        o = self.options
        if ray.get(self._store.engine.remote()) != attach_key(self.engine_config):
            return False
        running = self.replica_states().get("RUNNING", 0)
        if not running:
            return False
        self._handle = serve.get_app_handle(o.app_name)
        self.attached = True
        wanted, o.num_replicas = o.num_replicas, running
        if wanted != running:
            self.scale(wanted)
            self.wait_replicas(wanted)  # the sweep's runs measure at their count: all of it
        return True

    def _run(self, num_replicas: int) -> None:
        o = self.options
        actor_options: dict[str, Any] = {"num_cpus": o.num_cpus, "resources": dict(o.resources)}
        if o.num_gpus:
            actor_options["num_gpus"] = o.num_gpus
        app = (
            serve.deployment(RolloutReplica)
            .options(
                name=DEPLOYMENT_NAME,
                num_replicas=num_replicas,
                ray_actor_options=actor_options,
                max_ongoing_requests=o.max_ongoing_requests,
                graceful_shutdown_timeout_s=o.graceful_shutdown_timeout_s,
            )
            .bind(
                self.engine_config,
                store_name(o.app_name),
                o.initial_version,
                o.metrics_port,
                o.version_wait_s,
            )
        )
        # external_scaler_enabled lets scale() change the replica count alone; a second
        # serve.run would be a new code version and restart every replica.
        target = serve.RunTarget(app, name=o.app_name, route_prefix=None, external_scaler_enabled=True)
        (self._handle,) = serve.run_many([target], wait_for_applications_running=False)
        self.options.num_replicas = num_replicas
        self._wait_placed()

    def _wait_placed(self) -> None:
        """Wait until all the replicas run, or at least one with none other loading its engine (a
        replica registers as its construction starts): the rest wait for `rollout` resources, which
        may never come, and the driver trains with those that run and grows as Serve places more.
        Raises when the deployment failed, with the replica's own message (why its constructor
        failed)."""
        name = self.options.app_name
        while True:
            app = serve.status().applications.get(name)
            status = getattr(app, "status", None)  # a str enum: compares with its value
            if status == "DEPLOY_FAILED":
                raise RuntimeError(f"Deploying application {name} failed: {app.message}\n"
                                   f"{self._deployment_message()}")
            if status == "RUNNING":
                return
            now = self.serving()
            placed = live(self._registered(), serve_actor_names())
            if now.running >= 1 and all(r.get("serving") for r in placed.values()):
                log.warning("rollout: %d of %d replicas run; Serve places the others as `%s` resources "
                            "appear", now.running, now.target, ROLLOUT_RESOURCE)
                return
            time.sleep(0.2)

    def _deployment_message(self) -> str:
        app = serve.status().applications.get(self.options.app_name)
        dep = app.deployments.get(DEPLOYMENT_NAME) if app else None
        return f"{DEPLOYMENT_NAME}: {dep.message}" if dep and dep.message else "(Serve gave no replica message)"

    @property
    def num_replicas(self) -> int:
        return self.options.num_replicas

    def scale(self, num_replicas: int) -> ServingState:
        """Ask Serve for `num_replicas` in place and return what serves. A scale-down returns once the
        removed replicas have drained (their in-flight requests finish within
        graceful_shutdown_timeout_s), or after that plus drain_margin_s with whatever still drains; a
        scale-up returns at once: Serve keeps placing the new replicas as `rollout` resources appear,
        and generate() uses those that run. Neither raises for replicas that do not come."""
        if num_replicas < 1:
            raise ValueError(f"num_replicas: {num_replicas}; use 1 or more (delete the app to stop)")
        # This is the call behind Serve's REST scale endpoint (the dashboard, which
        # serves it, is off here). Running replicas stay; removed ones stop taking
        # requests and drain the in-flight ones (graceful_shutdown_timeout_s).
        from ray.serve._private.common import DeploymentID
        from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

        controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        dep = DeploymentID(name=DEPLOYMENT_NAME, app_name=self.options.app_name)
        before, o = self.options.num_replicas, self.options
        ray.get(controller.update_deployment_replicas.remote(dep, num_replicas))
        o.num_replicas = num_replicas
        if num_replicas < before:
            return self.wait_drained(o.graceful_shutdown_timeout_s + o.drain_margin_s)
        return self.serving()

    def wait_drained(self, timeout_s: float) -> ServingState:
        """Wait until no replica beyond the target is left in any state (a removed one is gone once
        it finished its requests); after `timeout_s`, log and return what serves."""
        deadline = time.monotonic() + timeout_s
        while not (now := self.serving()).drained:
            if time.monotonic() > deadline:
                log.warning("rollout replicas: %s after %.0f s, target %d; the operator keeps their pods until "
                            "they are gone", now.states, timeout_s, now.target)
                return now
            time.sleep(0.2)
        return now

    def serving(self) -> ServingState:
        """The replica count asked for, the replicas by state, and the pods hosting one."""
        registered = live(self._registered(), serve_actor_names())
        return ServingState(self.options.num_replicas, self.replica_states(), hosting_pods(registered))

    def replica_states(self) -> dict[str, int]:
        """Replica counts by state (RUNNING, STARTING, STOPPING, ...) from Serve."""
        app = serve.status().applications.get(self.options.app_name)
        if app is None or DEPLOYMENT_NAME not in app.deployments:
            return {}
        return {str(k): v for k, v in app.deployments[DEPLOYMENT_NAME].replica_states.items()}

    def wait_replicas(self, num_replicas: int, timeout_s: float = 600.0) -> None:
        """Block until exactly `num_replicas` replicas run and none is starting or draining."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = self.replica_states()
            if states == {"RUNNING": num_replicas}:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"rollout replicas: wanted {num_replicas} running, have {states} after "
                    f"{timeout_s:.0f} s; check the `{ROLLOUT_RESOURCE}` resources offered"
                )
            time.sleep(0.2)

    @property
    def backend(self) -> str:
        """The weight transfer backend the replicas' engines were built with (EngineConfig.transfer_backend)."""
        return str(self.engine_config.get("transfer_backend"))

    def publish_weights(self, version: int, weights: Any, trainer: Any = None) -> Any:
        """Publish `version` to every ready replica through vLLM's weight transfer engines: `weights` is a vLLM
        WeightSource (a learner's, re-iterated at every publish), or a dict or (name, tensor) pairs. `trainer`:
        where the trainer engine runs when not in this process alone (a learner's ranks, for ipc/shm).
        Versions increase, except that the newest may be sent again (a replica that fell behind catches up).
        Returns what it did (`describe()` for a log)."""
        if self._published is not None and version < self._published:
            raise ValueError(f"weights version {version} is older than the published {self._published}; "
                             "publish increasing versions")
        from rlscale.trainer.transfer.publisher import LocalTrainer, WeightPublisher

        source = weights if hasattr(weights, "metadata") else None
        if source is None:
            from rlscale.trainer.transfer.sources import TensorsSource

            self._tensors = self._tensors or TensorsSource({})
            self._tensors.items = list(weights.items() if isinstance(weights, Mapping) else weights)
            source = self._tensors
        trainer = trainer or (self._publisher.trainer if self._publisher is not None
                              and self._publisher.trainer.source is source else LocalTrainer(source))
        if self._publisher is None or self._publisher.trainer is not trainer:
            self.shutdown_sync()
            self._publisher = WeightPublisher(self.backend, self._store, self.transfer_members, trainer,
                                              host=ray.util.get_node_ip_address(),
                                              bucket_bytes=self.options.bucket_bytes,
                                              timeout_s=self.options.sync_timeout_s)
        self.last_sync = self._publisher.publish(version)
        self._published = version
        return self.last_sync

    def transfer_members(self) -> list[Member]:
        """The replicas a publish sends to: registered, alive and with their engine up."""
        return [Member(k, int(v.get("workers", 1))) for k, v in live(self._registered(), serve_actor_names()).items()
                if v.get("ready")]

    def behind(self) -> list[str]:
        """Ready replicas that hold an older version than the newest published (joined since, or broken)."""
        if self._published is None:
            return []
        reg = live(self._registered(), serve_actor_names())
        return sorted(k for k, v in reg.items() if v.get("ready") and int(v.get("version", -1)) < self._published)

    @property
    def weights_on_device(self) -> bool:
        """Whether the trainer's tensors are best on its accelerator: nccl and ipc send from device memory."""
        return self.backend in ("nccl", "ipc")

    def shutdown_sync(self) -> None:
        """Close the transfer group (the trainer engine and the replicas' side); the next publish forms one."""
        if self._publisher is not None:
            try:
                self._publisher.close()
            finally:
                self._publisher = None

    def sleep(self, level: int = 1, timeout_s: float = 300.0) -> None:
        """Colocated placement: every replica frees its accelerator for training (RolloutEngine.sleep where the
        engine has it and runs on a GPU; otherwise nothing)."""
        self._every_replica("sleep", {"level": level}, timeout_s)

    def wake_up(self, tags: list[str] | None = None, timeout_s: float = 300.0) -> None:
        """Undo `sleep`, all of it or the tags given (["weights"] before an update, then ["kv_cache"])."""
        self._every_replica("wake", {"tags": tags}, timeout_s)

    def _every_replica(self, op: str, payload: dict[str, Any], timeout_s: float) -> None:
        members = self.transfer_members()
        if members:
            ReplicaClient(self._store, members, timeout_s)._call(op, {m.id: payload for m in members})

    @property
    def published_version(self) -> int | None:
        return self._published

    def generate(
        self,
        prompt_token_ids: Sequence[Sequence[int]],
        samples_per_prompt: int = 1,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 64,
        seed: int | Sequence[int] | None = None,
        version: int | None = None,
        stop_token_ids: list[int] | None = None,
        top_k: int | None = None,
        min_p: float | None = None,
        repetition_penalty: float | None = None,
    ) -> list[list[Sample]]:
        """Per prompt its samples, generated with weights version >= `version` (default: newest published).
        `seed`: a base seed for the call, or one per prompt. Safe to call from several threads at once (the
        multi-turn loop's overtaking calls): each call has its own requests, and one thread at a time runs the
        catch-up hook."""
        if version is None:
            version = self._published if self._published is not None else self.options.initial_version
        if self.on_behind is not None and self.behind():
            with self._behind_lock:  # concurrent calls: one catch-up, the others wait for it
                if self.behind():
                    self.on_behind()
        prompts = [list(map(int, p)) for p in prompt_token_ids]
        if not prompts:
            return []
        # Seeds per prompt make the result independent of how prompts are chunked.
        seeds = None if seed is None else prompt_seeds(seed, len(prompts), samples_per_prompt)
        k = max(1, min(len(prompts), self.options.num_replicas * self.options.requests_per_replica))
        bounds = [round(i * len(prompts) / k) for i in range(k + 1)]
        requests = [
            GenerateRequest(
                prompt_token_ids=prompts[a:b],
                seeds=None if seeds is None else seeds[a:b],
                samples_per_prompt=samples_per_prompt,
                temperature=temperature,
                top_p=top_p,
                max_new_tokens=max_new_tokens,
                min_version=version,
                stop_token_ids=stop_token_ids,
                top_k=top_k,
                min_p=min_p,
                repetition_penalty=repetition_penalty,
            )
            for a, b in zip(bounds, bounds[1:], strict=False)
        ]
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(requests)) as pool:
            parts = list(pool.map(self._call_with_retries, requests))
        return [group for part in parts for group in part]

    def _call_with_retries(self, request: GenerateRequest) -> list[list[Sample]]:
        payload = asdict(request)
        for attempt in range(self.options.max_retries + 1):
            try:
                resp = self._handle.generate.remote(payload)
                return resp.result(timeout_s=self.options.request_timeout_s)
            except _RETRYABLE as exc:
                if attempt == self.options.max_retries:
                    raise
                with self._retries_lock:
                    self.retries += 1
                log.warning("rollout request failed on a lost replica (%s); retrying", type(exc).__name__)
                time.sleep(min(0.2 * 2**attempt, 5.0))  # let Serve notice and route around it
        raise AssertionError("unreachable")

    def replica_info(self) -> dict[str, Any]:
        """One replica's identity (whichever the router picks)."""
        return self._handle.info.remote().result()

    def replicas(self) -> dict[str, dict[str, Any]]:
        """Replicas up and not stopped (a crashed one may linger): id -> pid, node, pod,
        the weights version it started with, metrics URL."""
        return {k: v for k, v in self._registered().items() if v.get("serving", True)}

    def _registered(self) -> dict[str, dict[str, Any]]:
        """Every registered replica, those still starting included."""
        return ray.get(self._store.replicas.remote())

    def generation_seconds_total(self) -> float | None:
        """Engine seconds spent generating, from one replica's metrics (exact with one replica)."""
        text = self._handle.metrics_text.remote().result(timeout_s=30).decode()
        key = f"{ROLLOUT_PREFIX}generation_seconds_sum"
        for line in text.splitlines():
            if line.startswith(key):
                return float(line.rsplit(" ", 1)[1])
        return None

    def metrics_endpoints(self) -> list[str]:
        """The /metrics URLs of replicas started with a metrics port."""
        return [i["metrics_url"] for i in self.replicas().values() if i.get("metrics_url")]

    def shutdown(self) -> None:
        """Delete the Serve application and the weight store."""
        self.shutdown_sync()
        try:
            serve.delete(self.options.app_name)
        finally:
            if self._store is not None:
                ray.kill(self._store)
                self._store = None
