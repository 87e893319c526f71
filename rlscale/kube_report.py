"""The driver's progress report to its RLRun (annotation rlscale.dev/progress), over the in-cluster API.

Standard library only: the trainer image needs no Kubernetes client. The operator folds the
annotation into status (see docs/operations.md for the contract).
"""

from __future__ import annotations

import json
import logging
import math
import os
import ssl
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlscale.spec import API_GROUP, API_VERSION

ANNOTATION_PROGRESS = "rlscale.dev/progress"  # the operator's constants name the same key
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


# How a run ends, in the driver's last report; the operator makes each a condition and phase.
OUTCOME_SUCCEEDED = "Succeeded"
OUTCOME_BUDGET_EXHAUSTED = "BudgetExhausted"
# The driver met an error that a restart cannot fix (a reward that does not import, a spec
# the code cannot carry out): the run stops at once instead of crash-looping to its backoff limit.
OUTCOME_FAILED = "Failed"
MESSAGE_MAX = 1024  # characters of an error message in the report


def finite(x: Any) -> Any:
    """x with every NaN or infinity replaced by None (JSON, and so the API server, has neither)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def failure_body(rec: dict[str, Any] | None, message: str, *, permanent: bool) -> dict[str, Any]:
    """The report of a driver that stops on an error: the last step's figures (if any), the
    error, and outcome Failed when a restart would meet the same error."""
    body = (progress_body(rec, target_reached=False, failed=True) if rec
            else {"step": 0, "samples": 0, "targetReached": False, "failed": True})
    body["message"] = message[-MESSAGE_MAX:]
    if permanent:
        body["outcome"] = OUTCOME_FAILED
    return body


def progress_body(rec: dict[str, Any], *, target_reached: bool, failed: bool = False,
                  outcome: str | None = None, report: str | None = None) -> dict[str, Any]:
    """The report the operator reads, from one metrics.jsonl record; `outcome` on the last one."""
    body = {
        "step": rec["step"], "samples": rec["samples"], "reward": round(rec.get("reward_mean", 0.0), 6),
        "targetMetric": rec.get("target_metric"),
        "samplesPerSecond": round(rec.get("samples_per_second_recent", rec.get("samples_per_second", 0.0)), 3),
        "elapsedSeconds": round(rec.get("wall_seconds", 0.0), 2),
        "phaseSeconds": {k: round(v, 4) for k, v in rec.get("phases", {}).items()},
        # The windowed estimate when the driver has one (None: not significant, keep the prior).
        "noiseScale": rec["noise_scale_window"] if "noise_scale_window" in rec else rec.get("noise_scale"),
        "targetReached": target_reached, "failed": failed,
        "timeToTargetSeconds": rec.get("time_to_target_seconds"), "samplesToTarget": rec.get("samples_to_target"),
        "prompts": rec.get("prompts"), "samplesPerPrompt": rec.get("samples_per_prompt"),
        "checkpointSeconds": rec.get("checkpoint_seconds"),
    }
    if outcome:
        body["outcome"] = outcome
    if report:
        body["report"] = report
    return finite(body)


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

    def report(self, body: dict[str, Any], force: bool = False) -> bool:
        """Send now if due (or forced); a failure is logged, never raised: training goes on."""
        now = time.monotonic()
        if not force and now - self._last < self.min_interval:
            return False
        text = json.dumps(finite(body), sort_keys=True, allow_nan=False)
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
