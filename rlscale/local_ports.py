"""The metrics port of a local run, claimed before anything of the run starts.

The learner binds /metrics a minute into a run (after the Ray head, the rollout and the task checks), so a
second `rlscale run` started meanwhile saw 9400 free and collided with the first when its own learner bound
it. Each run now holds a lock file for its port from its first moment to its end: a run finds a port taken
when another run holds its lock or anything listens on it, and takes the next one."""

from __future__ import annotations

import fcntl
import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rlscale.roles import free_port

SEARCH = 100  # ports tried above the one asked for


class NoFreePort(RuntimeError):
    """Every port from --metrics-port up is held by a run or listened on."""


def lock_dir() -> Path:
    """One folder per user on this machine: every run of that user sees every other's claims."""
    d = Path(tempfile.gettempdir()) / f"rlscale-metrics-ports-{os.getuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    return d


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        # As the metrics server binds (prometheus_client's server reuses addresses): a port left in
        # TIME_WAIT by a finished run is free, one something listens on is not.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


@dataclass
class PortClaim:
    """A metrics port this process holds until release() (or its exit: the lock dies with it)."""

    port: int
    asked: int
    handle: IO[str] | None = None

    @property
    def moved(self) -> bool:
        """The port asked for was taken (0, "any free one", never counts as moved)."""
        return self.asked != 0 and self.port != self.asked

    def release(self) -> None:
        if self.handle is not None:
            self.handle.close()  # closing the file drops its flock
            self.handle = None


def claim_metrics_port(asked: int, host: str = "127.0.0.1") -> PortClaim:
    """`asked`, or the first port above it that no other run holds and nothing listens on; 0: a free one."""
    first = asked or free_port(host)
    for port in range(first, min(first + SEARCH, 65536)):
        handle = open(lock_dir() / f"{port}.lock", "w")  # noqa: SIM115  (held open: the lock is the claim)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        if _bindable(host, port):
            return PortClaim(port, asked, handle)
        handle.close()
    raise NoFreePort(f"--metrics-port: {first} to {min(first + SEARCH, 65536) - 1} are all taken (other runs hold "
                  f"them or something listens); pass --metrics-port 0 for any free port")
