"""A real Prometheus server on loopback, for scraping the run's /metrics."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from rlscale.roles import free_port  # noqa: F401  (tests import it from here)


def prometheus_binary() -> str:
    """The Prometheus built from its Go module by `make k8s` (hack/cluster/build-prometheus.sh,
    with Kubernetes discovery) when present in the k8s bin folder, else Debian's package
    (`make prometheus`), which lacks kubernetes_sd_configs but scrapes static targets alike."""
    cache = Path(os.environ.get("RLSCALE_CACHE") or Path.home() / ".cache/rlscale")
    env = (Path(__file__).resolve().parents[2] / "hack/cluster/versions.env").read_text()
    pins = dict(ln.split("=", 1) for ln in env.splitlines()
                if "=" in ln and not ln.lstrip().startswith("#"))
    k8s_bin = Path(os.environ.get("RLSCALE_K8S_BIN") or cache / "k8s" / pins["K8S_VERSION"])
    debian = Path.home() / ".cache/rlscale/prometheus/prometheus"
    for found in (k8s_bin / "prometheus", shutil.which("prometheus"), debian):
        if found and Path(found).is_file() and os.access(found, os.X_OK):
            return str(found)
    pytest.fail("prometheus is missing: `make prometheus` installs it (make test does); "
                "`make k8s` builds one with Kubernetes discovery")


class Prometheus:
    def __init__(self, workdir: Path, targets: list[str], interval: str = "1s"):
        self.port = free_port()
        cfg = workdir / "prometheus.yml"
        cfg.write_text(
            f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"
            f"scrape_configs:\n  - job_name: rlscale\n    static_configs:\n      - targets: {json.dumps(targets)}\n"
        )
        self.proc = subprocess.Popen(
            [prometheus_binary(), f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=open(workdir / "prometheus.log", "wb"), stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1)
                return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("prometheus did not become ready")

    def query(self, expr: str) -> list[dict]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
