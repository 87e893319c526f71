"""`rlscale run`: the same role entrypoints as the operator's pods, started as local processes."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlscale import local_view as view
from rlscale.cpu_split import CoreSplit, available_cpus
from rlscale.learner_launch import colocated, learner_launches, local_gpus
from rlscale.local_ports import claim_metrics_port
from rlscale.local_view import JsonlTail, console, progress_view
from rlscale.metrics_names import DEFAULT_METRICS_PORT
from rlscale.plan import Plan, make_plan
from rlscale.records import StepRecord
from rlscale.report import export_suffix
from rlscale.roles import Role, free_port
from rlscale.runconfig import ENV_CONFIG, LocalOptions, RunConfig
from rlscale.spec import RLRun

DEFAULT_CHECKPOINT_PATH = "/checkpoints"  # the pods' volume; locally it lives in the run directory


def _die_with_parent() -> None:
    """If the runner itself is killed (SIGKILL), its roles get SIGTERM instead of living on."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _child_setup(cpus: list[int] | None) -> Callable[[], None]:
    """What a role's process does before it runs: die with the runner; keep to `cpus` when given (every
    process it starts, Ray's workers included, inherits them)."""
    def setup() -> None:
        _die_with_parent()
        if cpus:
            os.sched_setaffinity(0, cpus)
    return setup


@dataclass
class RoleProcess:
    """One local process running a role entrypoint (named `<role>` or `<role>-<index>`), in its own process group."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen | None = None
    restarts: int = 0
    cpus: list[int] | None = None  # the CPU ids it keeps to (generating ahead); None: all

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.log, "ab")
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=fh, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_child_setup(self.cpus))
        fh.close()

    @property
    def role(self) -> Role:
        return next(r for r in Role if self.name == r or self.name.startswith(f"{r}-"))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send(self, sig: int) -> None:
        """SIGKILL to the whole group; any other signal to the role's own process, which stops what it
        runs itself, as a container's first process does: a launcher passes it to its ranks, and a
        learner finishes its step and checkpoints while the Ray node it started (a colocated run's
        engine on it) and its reward workers still serve it. Sent to the group, the node died with
        the step in flight: the colocated e2e run's Ctrl-C then waited on a lost replica."""
        if self.alive():
            try:
                if sig == signal.SIGKILL:
                    os.killpg(self.proc.pid, sig)
                else:
                    self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
        """Ask the role to stop, then make sure nothing of its group is left."""
        if self.proc is None:
            return
        self.send(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # stragglers the leader left behind
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 10  # return only once the whole group is gone
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.1)


@dataclass
class LocalRun:
    """Everything one embedded run starts, so that Ctrl-C stops exactly that."""

    cfg: RunConfig
    run_dir: Path
    roles: list[RoleProcess] = field(default_factory=list)
    token_dir: Path | None = None  # whose Ray token the roles use (shared nodes': theirs)

    def role_env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env[ENV_CONFIG] = str(self.run_dir / "run.json")
        # Ray 2.60 authenticates every client with a token; one per run, shared by its roles only.
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN_PATH"] = str(ray_token_file(self.token_dir or self.run_dir))
        env.setdefault("PYTHONUNBUFFERED", "1")
        # Serve's controller every 0.5 s, not 0.1 s: a local run deploys once and re-plans rarely, and each
        # wake-up stalls the engine's or learner's threads (docs/measurements.md, "A quiet Ray").
        env.setdefault("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "0.5")
        env.update(extra)
        return env

    def start(self, role: RoleProcess) -> RoleProcess:
        role.start()
        self.roles.append(role)
        return role

    @property
    def head(self) -> RoleProcess | None:
        return next((r for r in self.roles if r.role == Role.RAY_HEAD), None)

    @property
    def rollouts(self) -> list[RoleProcess]:
        return [r for r in self.roles if r.role == Role.ROLLOUT]

    def stop_all(self) -> None:
        # Learners first: the driver checkpoints on SIGTERM and writes the report.
        for r in [r for r in self.roles if r.role == Role.LEARNER]:
            r.stop(timeout=60.0)
        # Then Ray, both nodes and every worker at once, killed: the learners have written all
        # the run keeps, and Ray's drain on SIGTERM cost every run's end 11 s (docs/measurements.md,
        # "A local run's start and end"). Ray starts some workers (the Serve controller) in sessions of
        # their own; they carry the run's environment, which is how we find them beside the roles' groups.
        kill_and_wait(processes_of_run(str(self.run_dir / "run.json")))
        for r in [r for r in self.roles if r.role != Role.LEARNER]:
            r.stop(signal.SIGKILL, timeout=5.0)


@dataclass
class SharedNodes:
    """A Ray head and rollout processes that runs use one after another (rlscale sweep).

    Each run starts only its learners, which attach to the rollout app the first run deployed
    (LocalOptions.rollout_app) and replace its weights with their own before their first request; so the
    Ray nodes' start and the vLLM engine's initialisation (27-40 s of a run's 52-70 s start-up on
    2 cores) happen once per sweep instead of once per run. The nodes run with the first run's
    settings (its run.json, copied here with the nodes' own address and Ray token)."""

    dir: Path
    app: str
    address: str = ""
    local: LocalRun | None = None

    @property
    def head(self) -> RoleProcess | None:
        return self.local.head if self.local else None

    @property
    def rollouts(self) -> list[RoleProcess]:
        return self.local.rollouts if self.local else []

    def up(self) -> bool:
        return self.head is not None and self.head.alive()

    def claim_address(self) -> str:
        """The address the next run joins (a new one when the nodes are not up)."""
        if not self.up():
            self.stop()
            self.address = f"127.0.0.1:{free_port()}"
        return self.address

    def pinned_otherwise(self, cfg: RunConfig) -> bool:
        """The nodes run on other cores (or threads) than `cfg`'s rollout would: a run at another staleness
        of a staleness sweep, whose cores are split differently or not at all."""
        return self.local is not None and _rollout_pinning(self.local.cfg) != _rollout_pinning(cfg)

    def ensure(self, cfg: RunConfig, replicas: int, poll: Callable[[], Any] | None = None) -> None:
        """Start the head (when it is not up) and rollout processes up to `replicas`."""
        if not self.up():
            self.stop()
            self.dir.mkdir(parents=True, exist_ok=True)
            cfg.save(self.dir / "run.json")
            self.local = LocalRun(cfg, self.dir)
        _start_nodes(self.local, self.address, replicas, poll)

    def stop(self) -> None:
        if self.local is not None:
            self.local.stop_all()
            self.local = None


def _rollout_pinning(cfg: RunConfig) -> tuple[Any, ...]:
    o = cfg.local
    return (tuple(o.rollout_cpus or ()), o.rollout_cpu_threads) if o else ()


def _start_nodes(local: LocalRun, address: str, replicas: int, poll: Callable[[], Any] | None = None) -> None:
    """The Ray head at `address` (unless `local` has one running) and rollout processes up to `replicas`."""
    exe = [sys.executable, "-m", "rlscale.cli"]
    logs = local.run_dir / "logs"
    cpus = local.cfg.local.rollout_cpus if local.cfg.local else None
    if local.head is None or not local.head.alive():
        host, _, port = address.rpartition(":")
        _start_head(local, RoleProcess(Role.RAY_HEAD, exe + [Role.RAY_HEAD], local.role_env(),
                                       logs / f"{Role.RAY_HEAD}.log", cpus=cpus),
                    host, int(port), poll=poll)
    for i in range(len(local.rollouts), replicas):
        local.start(RoleProcess(f"{Role.ROLLOUT}-{i}", exe + [Role.ROLLOUT], local.role_env(),
                                 logs / f"{Role.ROLLOUT}-{i}.log", cpus=cpus))


def _start_learners(local: LocalRun, plan: Plan) -> list[RoleProcess]:
    """The learner processes (the first one's rank 0 drives the run), meeting on a free local port:
    a process a rank, or a launcher a replica with several ranks per replica."""
    exe = [sys.executable, "-m", "rlscale.cli", Role.LEARNER]
    spec = local.cfg.spec
    ranks = int(getattr(spec, "learner_ranks_per_pod", 1) or 1)
    replicas = int(plan.learner_replicas)
    envs = learner_launches(replicas, ranks, str(free_port()), colocated(plan), local_gpus(spec, replicas * ranks))
    cpus = local.cfg.local.learner_cpus if local.cfg.local else None
    if cpus and "OMP_NUM_THREADS" not in os.environ:  # torch's threads: the learner's cores over its processes
        envs = [{"OMP_NUM_THREADS": str(max(1, len(cpus) // (replicas * ranks))), **env} for env in envs]
    return [local.start(RoleProcess(f"{Role.LEARNER}-{i}", exe, local.role_env(**env),
                                    local.run_dir / f"logs/{Role.LEARNER}-{i}.log", cpus=cpus))
            for i, env in enumerate(envs)]


def processes_of_run(config_path: str) -> list[int]:
    """Pids whose environment names this run's config (every role and everything Ray forked)."""
    needle = b"\0" + f"{ENV_CONFIG}={config_path}".encode() + b"\0"
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in b"\0" + f.read() + b"\0":
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def kill_and_wait(pids: list[int], timeout: float = 5.0) -> None:
    """SIGKILL every pid, then wait (up to `timeout`) until none of them is left."""
    alive = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            alive.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + timeout
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _exists(p)]
        time.sleep(0.05)


def _exists(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b") ", 1)[1][:1] != b"Z"  # a zombie is gone for our purpose
    except OSError:
        return False


def ray_token_file(run_dir: Path) -> Path:
    """The run's Ray auth token (created once, readable by this user only)."""
    path = run_dir / "ray_auth_token"
    if not path.exists():
        import secrets

        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path


def _wait_port(host: str, port: int, proc: RoleProcess, timeout: float, poll: Callable[[], Any] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if poll is not None:
            poll()
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited early; see {proc.log}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.3)
    raise RuntimeError(f"{proc.name} did not listen on {host}:{port} within {timeout:.0f} s; see {proc.log}")


HEAD_READY = "Ray runtime started."  # what `ray start --head` logs once its node is registered


def _start_head(local: LocalRun, role: RoleProcess, host: str, port: int, attempts: int = 3,
                poll: Callable[[], Any] | None = None) -> RoleProcess:
    """Start the Ray head and wait until its node is up, not only its GCS port; `poll()` is called
    while waiting, and what it raises ends the wait.

    `ray start --head` gives its raylet 30 s to register with the GCS (a constant in Ray) and
    exits otherwise; on 2 busy cores it did ("The current node timed out during startup", twice in
    tests/e2e/test_embedded_run.py run beside the rest of the suite). Such a start is retried,
    before any other role depends on the head."""
    for attempt in range(1, attempts + 1):
        offset = role.log.stat().st_size if role.log.exists() else 0
        head = local.start(role)
        try:
            _wait_port(host, port, head, timeout=120, poll=poll)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and head.alive():
                if poll is not None:
                    poll()
                with open(head.log, "rb") as f:
                    f.seek(offset)
                    if HEAD_READY.encode() in f.read():
                        return head
                time.sleep(0.25)
            if head.alive():
                raise RuntimeError(f"the Ray head did not come up within 120 s; see {head.log}")
        except RuntimeError:
            if attempt == attempts or head.alive():
                raise
        head.stop()
        local.roles.remove(head)
        role = RoleProcess(role.name, role.argv, role.env, role.log)
    raise RuntimeError(f"the Ray head did not start in {attempts} attempts; see {role.log}")


def resolve_model_dir(path: str) -> str:
    """A local model directory for the spec's model.path (builtin models are built and cached)."""
    if path.startswith("builtin:"):
        from rlscale.trainer.builtin import (
            ensure_builtin_model,  # heavy: only the embedded run needs it
        )

        return str(ensure_builtin_model(path))
    return path


def check_task(spec, model_dir: str) -> None:
    """The workload's checks (a bad row, reward or template stops the run here, before any learner
    has started), and one line on what the task holds."""
    from rlscale.trainer.data import check_before_start

    task = check_before_start(spec, model_dir)
    dropped = sum(task.dropped.values())
    console.print(f"task: {task.name}, {len(task.train)} train and {len(task.eval)} held-out prompts"
                  f"{' (chat template)' if task.chat else ''}"
                  + (f", {dropped} longer than maxLength - maxNewTokens dropped" if dropped else ""),
                  highlight=False)


def _core_split(plan: Plan, cpus: list[int]) -> CoreSplit | None:
    """Disjoint cores for the rollout and the learner when the plan generates ahead on a cpu host: the
    split the planner predicted it at (Prediction.cores, cpu_split.py)."""
    if not plan.predicted.cores:
        return None
    n = plan.predicted.cores[0]
    return CoreSplit(cpus[:n], cpus[n:])


def prepare_run(rlrun: RLRun, runs_dir: Path, metrics_port: int, fresh: bool, options: LocalOptions | None = None,
                seed: int | None = None, ray_address: str | None = None) -> tuple[RunConfig, Path, Plan]:
    """Plan, resolve the model and write run.json into runs/<name>/ (`ray_address`: an existing
    cluster's, else a free port for the run's own head). `options`: head_cpus and rollout_cpu_threads
    are filled in from this machine's cores."""
    spec = rlrun.spec
    k = options.staleness if options else None
    if k is not None and k > spec.algorithm.max_staleness:
        raise ValueError(f"staleness {k} is above spec.algorithm.maxStaleness ({spec.algorithm.max_staleness}); "
                         f"raise maxStaleness to {k}, or pin at most {spec.algorithm.max_staleness}")
    cpus = available_cpus()
    # k pinned (--staleness, a sweep's run): predicted and explained at k; generating ahead on a cpu host,
    # each side is predicted on the cores it will get.
    plan = make_plan(spec, staleness=k, host_cores=len(cpus))
    run_dir = (runs_dir / rlrun.name).resolve()
    if fresh and run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = spec.checkpoint.path
    ckpt_dir = run_dir / "checkpoints" if ckpt == DEFAULT_CHECKPOINT_PATH else Path(ckpt).resolve()
    model_dir = resolve_model_dir(spec.model.path)
    port = metrics_port or free_port()
    cores = max(1, os.cpu_count() or 1)
    # Generation and training take turns on this host, so a replica may use every core its
    # share allows; the most replicas a re-plan may choose sets that share, so adding
    # replicas never oversubscribes the cores. Generating ahead, they run at once: each gets its own.
    r = spec.rollout.replicas
    most_replicas = max(plan.rollout_replicas, spec.rollout.max_replicas if r == "auto" else r)
    split = _core_split(plan, cpus)
    rollout_cores = len(split.rollout) if split else cores
    local = dataclasses.replace(options or LocalOptions(), head_cpus=cores,
                                rollout_cpu_threads=max(1, rollout_cores // most_replicas),
                                rollout_cpus=split.rollout if split else None,
                                learner_cpus=split.learner if split else None)
    cfg = RunConfig.from_rlrun(
        rlrun, plan, ray_address=ray_address or f"127.0.0.1:{free_port()}", metrics_port=port,
        checkpoint_dir=str(ckpt_dir), report_dir=str(run_dir), model_dir=model_dir,
        object_store_bytes=512 * 2**20, seed=seed, local=local)
    cfg.save(run_dir / "run.json")
    return cfg, run_dir, plan


def run_embedded(rlrun: RLRun, *, metrics_port: int = DEFAULT_METRICS_PORT, runs_dir: Path = Path("runs"),
                 fresh: bool = False, linger: float = 0.0, seed: int | None = None, replan: bool = True,
                 render: Callable[[StepRecord | None], Any] | None = None,
                 shared: SharedNodes | None = None, staleness: int | None = None, source: Path | None = None) -> int:
    """Run the RLRun on this machine; returns the driver's exit code.

    `seed` (None: spec.seed) and `replan`: see RunConfig.seed and LocalOptions.replan; `render(last_record)`
    replaces the progress view, and the console lines around the run, for a caller that shows its own (rlscale sweep);
    `shared`: Ray nodes and a rollout app kept across runs, which the run joins (started if not up);
    `staleness`: pins the plan's staleness (LocalOptions.staleness); `source`: the spec's file, for the
    commands shown at the end. A finished run (its target reached, or its budget spent) starts nothing
    unless `fresh`: it says so and returns how it ended.
    """
    quiet = render is not None
    done = None if fresh else view.finished_end((runs_dir / rlrun.name).resolve(), rlrun.spec)
    if done is not None:
        if not quiet:
            view.print_finished(*done, (runs_dir / rlrun.name).resolve(), source, rlrun.name)
        return int(done[0])
    if not quiet:
        console.rule(f"[bold]rlscale run[/] {rlrun.name}")
    # Claimed first and held to the end, so no run started meanwhile takes it (docs: rlscale/local_ports.py).
    claim = claim_metrics_port(metrics_port)
    try:
        return _run_claimed(rlrun, claim.port, runs_dir, fresh, linger, seed, replan, render, shared, staleness,
                            source, f" (port {claim.asked} is taken)" if claim.moved else "")
    finally:
        claim.release()


def _run_claimed(rlrun: RLRun, metrics_port: int, runs_dir: Path, fresh: bool, linger: float, seed: int | None,
                 replan: bool, render: Callable[[StepRecord | None], Any] | None, shared: SharedNodes | None,
                 staleness: int | None, source: Path | None, port_note: str) -> int:
    """run_embedded on its claimed metrics port."""
    spec = rlrun.spec
    quiet = render is not None
    address = None
    options = LocalOptions(linger_seconds=linger, replan=replan, staleness=staleness)
    if shared is not None:
        address = shared.claim_address()
        options.rollout_app = shared.app
    cfg, run_dir, plan = prepare_run(rlrun, runs_dir, metrics_port, fresh, options, seed, address)
    if shared is not None and shared.pinned_otherwise(cfg):
        # Kept nodes pinned for another split would measure this run on the wrong cores: new ones.
        shared.stop()
        cfg.ray_address = shared.claim_address()
        cfg.save(run_dir / "run.json")
    if not quiet:
        view.print_start(cfg, plan, run_dir, port_note)

    local = LocalRun(cfg, run_dir, token_dir=shared.dir if shared is not None else None)
    interrupted = {"n": 0}

    def on_sigint(signum, frame):  # first Ctrl-C: checkpoint and stop; second: stop now
        interrupted["n"] += 1
        sig = signal.SIGTERM if interrupted["n"] == 1 else signal.SIGKILL
        for r in local.roles:
            if r.role == Role.LEARNER:
                r.send(sig)

    old = {s: signal.signal(s, on_sigint) for s in (signal.SIGINT, signal.SIGTERM)}
    code = 1
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="task-check")
    try:
        # The task's checks (importing transformers: most of the CLI's start) run while the Ray nodes
        # come up; the learners start only once they pass, and a failed check stops the nodes.
        check = pool.submit(check_task, spec, cfg.model_dir)

        def check_failed() -> None:  # a failed check ends the wait for the head at once, with its error
            if check.done():
                check.result()

        # Colocated: no rollout processes; the learners' Ray nodes offer the rollout slots.
        rollouts = 0 if colocated(plan) else int(plan.rollout_replicas)
        if shared is None:
            _start_nodes(local, cfg.ray_address, rollouts, poll=check_failed)
        else:
            shared.ensure(cfg, rollouts, poll=check_failed)
        nodes = local if shared is None else shared
        check.result()
        learners = _start_learners(local, plan)
        code = _watch(local, learners[0], nodes.rollouts, nodes.head, run_dir, spec, render)
    finally:
        pool.shutdown(wait=True)  # a check still running (the head failed first) ends before the nodes stop
        local.stop_all()
        for s, h in old.items():
            signal.signal(s, h)
    if not quiet:
        # " — exported to runs/<name>/export/hf (step N)"
        view.print_end(code, run_dir, spec, source, export_suffix(run_dir) if spec.export.hf else "")
    return code


def _watch(local: LocalRun, driver: RoleProcess, rollouts: list[RoleProcess], head: RoleProcess | None,
           run_dir: Path, spec, render: Callable[[StepRecord | None], Any] | None = None) -> int:
    """Show progress from metrics.jsonl until the driver exits; keep rollout processes alive."""
    tail = JsonlTail(run_dir / "metrics.jsonl")
    tail.skip_existing()
    last: StepRecord | None = None
    t = spec.target
    first = view.first_record(tail.path)  # a resumed run's score before training is in its first record
    start = (first.eval_at_start or {}).get(t.metric) if first else None
    bar = view.TargetBar(t.metric, t.value, console, start)
    line = None
    if render is None:
        def render(rec):
            return progress_view(rec, t.value, t.metric, spec.budget.max_samples, bar.bar)

        def line(rec):
            return view.progress_line(rec, t.value, t.metric)
    head_lost: float | None = None
    with view.RunView(console, render, line) as live:
        while driver.alive():
            recs = tail.read()
            for rec in recs:
                bar.see(rec)
            if recs:
                last = recs[-1]
            for r in rollouts:
                if not r.alive() and r.restarts < 3:
                    # a lost rollout process is restarted; its replica reloads the newest weights on join
                    r.restarts += 1
                    r.start()
            for other in local.roles:
                if (other.role == Role.LEARNER and other is not driver and not other.alive()
                        and other.proc.returncode):
                    console.print(f"[red]{other.name} exited with {other.proc.returncode}[/]; stopping the run")
                    driver.send(signal.SIGTERM)
            if head is not None and not head.alive():
                # A head that exits mid-run leaves the driver retrying the GCS for minutes: stop the run.
                if head_lost is None:
                    head_lost = time.monotonic()
                    console.print(f"[red]the Ray head exited[/] (see {head.log}); stopping the run", highlight=False)
                    driver.send(signal.SIGTERM)
                elif time.monotonic() - head_lost > 30:
                    driver.send(signal.SIGKILL)
            live.update(last, recs)
            time.sleep(0.25)
        recs = tail.read()
        for rec in recs:
            bar.see(rec)
        if recs:
            last = recs[-1]
        live.update(last, recs)
    if head_lost is not None:
        return 1  # a failure, not an interruption: nothing asked the run to stop
    return driver.proc.returncode if driver.proc else 1
