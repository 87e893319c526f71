"""Several learner ranks in one pod (or one `rlscale run` learner process): a small launcher.

A learner pod with G ranks (spec.learner.ranksPerReplica, one per GPU) runs `rlscale learner` once;
that process starts the G rank processes and does nothing else but watch them:

- each rank gets RANK = NODE_RANK x G + LOCAL_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE = G and the pod's
  WORLD_SIZE (pods x G), MASTER_ADDR and MASTER_PORT unchanged (pod 0's local rank 0 is rank 0);
- SIGTERM or SIGINT to the launcher goes to every rank once (the kubelet's stop, the runner's
  Ctrl-C): rank 0 checkpoints with the others' help and releases them;
- a rank that exits non-zero takes the others down: they get a few seconds to end on their own (a
  rank 0 that ended the run released them already), then SIGKILL, and the launcher exits with the
  first non-zero code, so the pod restarts and the gang restarts as it does with one rank a pod
  (trainer/gang.py); exit 0 only when every rank exited 0.

Each rank's CPU threads (OMP_NUM_THREADS, which torch reads at start) are the pod's cores over its ranks
unless the pod's env sets them: left to itself every rank starts one thread per core, and G ranks on
C cores run G x C threads that spin against each other in every gloo collective and every matmul.

Each rank runs in a session of its own (the launcher alone forwards signals, once) and dies with
the launcher (a parent-death SIGKILL): nothing is left when the launcher is killed.

Not torchrun: no elastic agent, no rendezvous store of its own; the ranks rendezvous through
MASTER_ADDR/MASTER_PORT as single-rank pods do. Only the standard library here.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

log = logging.getLogger("rlscale.launcher")

# Set in every rank's environment: the process is a rank, not a launcher.
LAUNCHED_ENV = "RLSCALE_LAUNCHED"
# Seconds the other ranks get to end on their own once one exited non-zero.
KILL_GRACE_S = 5.0


def cpu_budget(cgroup: str = "/sys/fs/cgroup/cpu.max") -> int:
    """The cores this process may use: its container's CPU limit (cgroup v2 `cpu.max`) when there is
    one, else the CPUs it is pinned to."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = open(cgroup).read().split()[:2]
    except (OSError, ValueError):
        return cores
    if quota == "max":
        return cores
    return max(1, min(cores, int(int(quota) // int(period))))


def rank_threads(env: Mapping[str, str], local_world: int, cores: int) -> dict[str, str]:
    """OMP_NUM_THREADS for each rank: the pod's env wins; else its cores over its ranks, at least one."""
    if env.get("OMP_NUM_THREADS"):
        return {}
    return {"OMP_NUM_THREADS": str(max(1, cores // max(1, local_world)))}


def _die_with_launcher() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass(frozen=True)
class Layout:
    """Where this pod's ranks sit in the gang."""

    node_rank: int  # the pod's index (NODE_RANK)
    local_world: int  # ranks in this pod (LOCAL_WORLD_SIZE)
    world_size: int  # ranks in the gang (WORLD_SIZE)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Layout:
        env = os.environ if environ is None else environ
        g = int(env.get("LOCAL_WORLD_SIZE") or 1)
        node = int(env.get("NODE_RANK") or 0)
        return cls(node, g, int(env.get("WORLD_SIZE") or g))

    def rank_env(self, local_rank: int) -> dict[str, str]:
        return {"RANK": str(self.node_rank * self.local_world + local_rank), "LOCAL_RANK": str(local_rank),
                "LOCAL_WORLD_SIZE": str(self.local_world), "WORLD_SIZE": str(self.world_size),
                "NODE_RANK": str(self.node_rank), LAUNCHED_ENV: "1"}


def is_launcher(environ: Mapping[str, str] | None = None) -> bool:
    """Whether `rlscale learner` here should start the pod's ranks (G > 1, not itself a rank)."""
    env = os.environ if environ is None else environ
    return int(env.get("LOCAL_WORLD_SIZE") or 1) > 1 and not env.get(LAUNCHED_ENV)


def exit_code(returncode: int) -> int:
    """A child's status as a shell gives it: killed by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class Launcher:
    """Starts the ranks (`argv` each, with its rank's environment) and watches them until they end."""

    def __init__(self, argv: Sequence[str], layout: Layout, env: Mapping[str, str] | None = None,
                 grace_s: float = KILL_GRACE_S, poll_s: float = 0.1):
        self.argv, self.layout = list(argv), layout
        self.env = dict(os.environ if env is None else env)
        self.grace_s, self.poll_s = grace_s, poll_s
        self.procs: list[subprocess.Popen] = []
        self._signalled = False

    def start(self) -> None:
        threads = rank_threads(self.env, self.layout.local_world, cpu_budget())
        for local in range(self.layout.local_world):
            env = {**self.env, **threads, **self.layout.rank_env(local)}
            self.procs.append(subprocess.Popen(self.argv, env=env,
                                               start_new_session=True, preexec_fn=_die_with_launcher))
        log.info("started %d ranks (pids %s) of pod %d, world size %d, %s CPU threads each", len(self.procs),
                 [p.pid for p in self.procs], self.layout.node_rank, self.layout.world_size,
                 threads.get("OMP_NUM_THREADS") or self.env.get("OMP_NUM_THREADS"))

    def forward(self, signum: int, _frame=None) -> None:
        """The launcher's stop goes to every rank still running, once (a second one too: the
        runner's second Ctrl-C means now)."""
        self._signalled = True
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.send_signal(signum)
                except ProcessLookupError:
                    pass

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
        for p in self.procs:
            p.wait()

    def wait(self) -> int:
        """Until every rank ended: 0 when all exited 0, else the first non-zero exit's code."""
        while True:
            codes = [p.poll() for p in self.procs]
            failed = next(((i, c) for i, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None:
                return self._fail(*failed)
            if all(c == 0 for c in codes):
                return 0
            time.sleep(self.poll_s)

    def _fail(self, local: int, code: int) -> int:
        rank = self.layout.node_rank * self.layout.local_world + local
        log.log(logging.INFO if self._signalled else logging.ERROR,
                "rank %d (local %d) exited with %d; stopping this pod's other ranks", rank, local, code)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(self.poll_s)
        self.kill_all()
        return exit_code(code)

    def run(self) -> int:
        """start(), forwarding SIGTERM and SIGINT while the ranks run, then wait()."""
        old = {s: signal.signal(s, self.forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            return self.wait()
        except BaseException:
            self.kill_all()
            raise
        finally:
            for s, h in old.items():
                signal.signal(s, h)


def launch(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    """Run this pod's ranks (LOCAL_WORLD_SIZE of them, each `argv`); the launcher's exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s launcher %(levelname)s %(message)s")
    return Launcher(argv, Layout.from_env(environ), environ).run()
