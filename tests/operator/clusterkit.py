"""Helpers for the operator tests: waiting, kubectl (hack.cluster.Kube), the operator process,
example runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from policykit import policy_env  # noqa: E402  (tests/operator is on sys.path)

from hack import cluster as cp
from hack.cluster import Kube
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[2]
OPERATOR_NS = "rlscale-system"
OPERATOR_SA = "rlscale-operator"  # the chart's name for release "rlscale"
K8S_VERSION = cp.versions()["K8S_VERSION"]
# What the test modules import from here (cp is the package hack.cluster, Kube its kubectl helper).
__all__ = ["K8S_VERSION", "OPERATOR_NS", "OPERATOR_SA", "REPO", "Kube", "Operator", "chart_objects", "cp",
           "example_run", "wait_for"]


def chart_objects(helm: Path, *set_args: str, release: str = "rlscale") -> list[dict]:
    """`helm template` of the chart, parsed."""
    # helm built from source assumes Kubernetes v1.20 offline; say which one we run.
    out = subprocess.run([str(helm), "template", release, str(REPO / "charts" / "rlscale"),
                          "--namespace", OPERATOR_NS, "--kube-version", K8S_VERSION, *set_args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


class Operator:
    """`python -m rlscale.operator` as a child process, started and stopped by the tests."""

    def __init__(self, kubeconfig: Path, logdir: Path):
        self.kubeconfig = kubeconfig
        self.logdir = logdir
        self.proc: subprocess.Popen | None = None
        self.metrics_port = 0
        self.starts = 0

    def start(self, *args: str, **env: str) -> Operator:
        assert self.proc is None
        self.metrics_port = cp.free_port()
        self.starts += 1
        log = open(self.logdir / f"operator-{self.starts}.log", "wb")
        # The admin policy the examples and the tests' runs need (policykit.ALLOWING), as chart values set it.
        e = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "RLSCALE_OPERATOR_BIND": "127.0.0.1",
             "RLSCALE_PROGRESS_INTERVAL": "1", "RLSCALE_CHECKPOINT_STORAGE": "", **policy_env(), **env}
        self.proc = subprocess.Popen([sys.executable, "-m", "rlscale.operator", "--metrics-port",
                                      str(self.metrics_port), *args], env=e, stdout=log, stderr=subprocess.STDOUT,
                                     cwd=REPO)
        log.close()
        wait_for("operator /metrics", self._metrics_up, timeout=60)
        return self

    def _metrics_up(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"operator exited:\n{self.log_tail()}")
        try:
            return bool(self.metrics())
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log_tail(self, n: int = 40) -> str:
        p = self.logdir / f"operator-{self.starts}.log"
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:]) if p.exists() else ""


def example_run(name: str, path: str = "examples/grpo-h100.yaml", **spec_over: Any) -> dict:
    """An example RLRun with a new name and spec fields replaced (top-level keys merged)."""
    obj = yaml.safe_load((REPO / path).read_text())
    obj["metadata"] = {"name": name}
    for k, v in spec_over.items():
        if isinstance(v, dict) and isinstance(obj["spec"].get(k), dict):
            obj["spec"][k] = {**obj["spec"][k], **v}
        else:
            obj["spec"][k] = v
    return obj
