"""The cluster's daemons as processes: start one in its own session with its log in the
cluster's logs/ folder (its pid recorded in state.json), wait on it, stop a set of them.
Stdlib only."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .config import LOOPBACK, ClusterError, bin_dir

if TYPE_CHECKING:
    from .controlplane import Cluster


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    # A zombie child of this process still answers kill(0); treat it as dead.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def spawn(c: Cluster, name: str, args: list[str], exe: Path | None = None) -> int:
    """Start the component `name` (bin_dir()/name unless exe is given) and record its pid."""
    exe = exe or bin_dir() / name
    if not exe.exists():
        raise ClusterError(f"{exe} is missing: run `make k8s` (bash hack/cluster/build.sh) first")
    logf = open(c.log(name), "ab")
    # A new session keeps the daemons alive after up.sh exits and out of its signals.
    p = subprocess.Popen([str(exe), *args], stdout=logf, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True, cwd=c.dir)
    logf.close()
    c.pids[name] = p.pid
    c.save()
    return p.pid


def wait_until(what: str, ok, timeout: float, c: Cluster, component: str) -> None:
    """Poll ok() until it is true; fail early, with the log's tail, when component exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        if not pid_alive(c.pids.get(component, 0)):
            raise ClusterError(f"{component} exited while waiting for {what}; "
                               f"last log lines:\n{tail(c.log(component))}")
        time.sleep(0.2)
    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}; "
                       f"last {component} log lines:\n{tail(c.log(component))}")


def tail(p: Path, n: int = 15) -> str:
    try:
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def port_open(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def stop(c: Cluster, names: list[str], grace: float = 15) -> None:
    """SIGTERM the named components together, SIGKILL what is left after grace seconds."""
    pids = [c.pids[n] for n in names if n in c.pids]
    for pid in pids:
        if pid_alive(pid):
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
    deadline = time.monotonic() + grace
    for pid in pids:
        while pid_alive(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.1)
        if pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            _reap(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
