"""A real Prometheus server on loopback, for scraping the run's /metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from rlscale.roles import free_port  # noqa: F401  (tests import it from here)


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or str(Path.home() / ".cache/rlscale/prometheus/prometheus")
    if not Path(found).exists():
        pytest.fail("prometheus is missing: `make prometheus` installs it (make test does)")
    return found


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
