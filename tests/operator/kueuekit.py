"""Kueue's own controller manager (built by `make k8s`: hack/cluster/build.sh kueue) run against
the test control plane, so the operator's queued runs meet the real admission logic.

It runs on this machine like the control plane's components, with two differences from a pod:
no webhooks are registered with the API server (it could not call back into this process; the
operator writes complete Workloads, which is what the webhooks would check), and its serving
certificates are made here. Kueue reads its metrics certificate from /etc/kueue/metrics/certs
(a fixed path when it does not manage certificates itself), so it runs in a mount namespace of
its own where that folder is this test's: nothing is written under /etc but the empty mount
point /etc/kueue."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from pathlib import Path

from clusterkit import cp, wait_for

KUEUE_NS = "kueue-system"
# The operator's kind, as Kueue's configuration names an integration it does not run itself.
EXTERNAL_FRAMEWORK = "RLRun.v1alpha1.rlscale.dev"


def _cert(folder: Path, cn: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                          "-subj", f"/CN={cn}", "-addext", "subjectAltName=IP:127.0.0.1",
                          "-keyout", str(folder / "tls.key"), "-out", str(folder / "tls.crt")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


class Kueue:
    """One Kueue controller manager; `start` installs its CRDs and waits until it is ready."""

    def __init__(self, cluster, kube, workdir: Path) -> None:
        self.cluster, self.kube, self.dir = cluster, kube, workdir
        self.proc: subprocess.Popen | None = None
        self.log = workdir / "kueue.log"

    def start(self) -> Kueue:
        binary, crds = cp.bin_dir() / "kueue", cp.bin_dir() / "kueue-crds"
        assert binary.exists() and crds.is_dir(), f"{binary} missing: run `make k8s` (hack/cluster/build.sh kueue)"
        # Server-side: the Workload CRD is too large for kubectl's last-applied annotation.
        self.kube.run("apply", "--server-side", "-f", str(crds))
        self.kube.wait("condition=Established", "-f", str(crds))
        self.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NS}})
        _cert(self.dir / "webhook", "kueue-webhook")
        _cert(self.dir / "etc-kueue" / "metrics" / "certs", "kueue-metrics")
        self.health, metrics, webhook, visibility = (cp.free_port() for _ in range(4))
        config = self.dir / "config.yaml"
        config.write_text(f"""apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: {KUEUE_NS}
health:
  healthProbeBindAddress: 127.0.0.1:{self.health}
metrics:
  bindAddress: 127.0.0.1:{metrics}
webhook:
  host: 127.0.0.1
  port: {webhook}
  certDir: {self.dir / "webhook"}
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
manageJobsWithoutQueueName: false
integrations:
  frameworks: []
  externalFrameworks: ["{EXTERNAL_FRAMEWORK}"]
""")
        os.makedirs("/etc/kueue", exist_ok=True)
        script = 'mount --bind "$0" /etc/kueue && exec "$@"'
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(self.dir / "etc-kueue"),
               # The on-demand visibility API server reads its certificate from /visibility; the
               # tests do not use it.
               str(binary), f"--config={config}", "--feature-gates=VisibilityOnDemand=false",
               f"--visibility-server-port={visibility}", "--zap-log-level=2"]
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        t0 = time.monotonic()
        wait_for("Kueue ready", self._ready, 120)
        print(f"\nKueue up in {time.monotonic() - t0:.1f}s", flush=True)
        return self

    def _ready(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"kueue exited:\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health}/readyz", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def tail(self, n: int = 40) -> str:
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join(lines[-n:])

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
