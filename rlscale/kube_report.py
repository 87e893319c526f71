"""Sending the driver's progress report (rlscale.progress_report) to its RLRun, as the annotation
rlscale.dev/progress, over the in-cluster API.

Standard library only: the trainer image needs no Kubernetes client. The operator folds the
annotation into status (see docs/operations.md for the contract).
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rlscale.progress_report import ANNOTATION_PROGRESS, ProgressReport
from rlscale.spec import API_GROUP, API_VERSION

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
log = logging.getLogger("rlscale.progress")


@dataclass
class KubeTarget:
    """Where and as whom to patch: the API server URL, a bearer token and the CA bundle."""

    server: str
    token: str
    ca_file: str | None
    namespace: str
    name: str

    @classmethod
    def in_cluster(cls, name: str | None = None, namespace: str | None = None) -> KubeTarget | None:
        """From the pod's service account and RLSCALE_RUN/RLSCALE_NAMESPACE; None outside a cluster."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        name = name or os.environ.get("RLSCALE_RUN")
        namespace = namespace or os.environ.get("RLSCALE_NAMESPACE")
        if not (host and name and namespace and (SA_DIR / "token").exists()):
            return None
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", (SA_DIR / "token").read_text().strip(), str(SA_DIR / "ca.crt"),
                   namespace, name)


class ProgressReporter:
    """Merge-patches the progress annotation, at most every `min_interval` seconds (the last report always goes)."""

    def __init__(self, target: KubeTarget, min_interval: float = 5.0, timeout: float = 5.0):
        self.target = target
        self.min_interval = min_interval
        self.timeout = timeout
        self._last = 0.0
        ctx = ssl.create_default_context(cafile=target.ca_file) if target.ca_file else ssl.create_default_context()
        self._opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx))

    @property
    def url(self) -> str:
        t = self.target
        return f"{t.server}/apis/{API_GROUP}/{API_VERSION}/namespaces/{t.namespace}/rlruns/{t.name}"

    def due(self) -> bool:
        """A report sent now would not be dropped as too soon after the last one."""
        return time.monotonic() - self._last >= self.min_interval

    def report(self, body: ProgressReport, force: bool = False) -> bool:
        """Send now if due (or forced); a failure is logged, never raised: training goes on."""
        now = time.monotonic()
        if not force and not self.due():
            return False
        text = body.to_json()
        patch = json.dumps({"metadata": {"annotations": {ANNOTATION_PROGRESS: text}}}).encode()
        req = urllib.request.Request(self.url, data=patch, method="PATCH", headers={
            "Content-Type": "application/merge-patch+json", "Authorization": f"Bearer {self.target.token}",
            "Accept": "application/json"})
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                resp.read()
            self._last = now
            return True
        except OSError as exc:  # URLError, HTTPError, timeouts
            log.warning("progress report to %s failed: %s", self.url, exc)
            return False
