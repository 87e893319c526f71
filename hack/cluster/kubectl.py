"""The kubectl built from k8s.io/kubernetes against one local cluster, as the tests and the
benches use it: run a command, get an object as a dict, apply objects, patch, wait for a
condition. Stdlib only."""

from __future__ import annotations

import json
import subprocess
from typing import TYPE_CHECKING, Any

from .config import ClusterError

if TYPE_CHECKING:
    from .controlplane import Cluster


class Kube:
    """kubectl as the cluster's admin (Cluster.kubectl), with the calls tests repeat."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def run(self, *args: str, input: str | None = None, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess:
        """`kubectl ARGS`; a failure raises ClusterError unless check is False."""
        return self.cluster.kubectl(*args, input=input, check=check, timeout=timeout)

    def get(self, kind: str, name: str | None = None, ns: str | None = None,
            selector: str | None = None) -> Any:
        """The object (or, without a name, the list) as a dict; None when it is not found."""
        args = ["get", kind, *([name] if name else []), "-o", "json"]
        if ns:
            args += ["-n", ns]
        if selector:
            args += ["-l", selector]
        out = self.run(*args, check=False)
        if out.returncode != 0:
            if "NotFound" in out.stderr:
                return None
            raise ClusterError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
        return json.loads(out.stdout)

    def apply(self, obj: dict | list[dict] | str, ns: str | None = None, check: bool = True,
              server_side: bool = False) -> subprocess.CompletedProcess:
        """`kubectl apply` of one object (a dict, or YAML/JSON text), or of a list of them as a List."""
        if isinstance(obj, list):
            obj = {"apiVersion": "v1", "kind": "List", "items": obj}
        text = obj if isinstance(obj, str) else json.dumps(obj)
        args = ["apply", *(["--server-side"] if server_side else []), "-f", "-", *(["-n", ns] if ns else [])]
        return self.run(*args, input=text, check=check)

    def patch(self, kind: str, name: str, ns: str | None, patch: dict,
              type: str = "merge") -> subprocess.CompletedProcess:
        """`kubectl patch` with a merge patch (or a json/strategic one, by type)."""
        return self.run("patch", kind, name, *(["-n", ns] if ns else []), f"--type={type}",
                        "-p", json.dumps(patch))

    def wait(self, condition: str, *targets: str, ns: str | None = None,
             timeout: float = 60) -> subprocess.CompletedProcess:
        """`kubectl wait --for=CONDITION TARGETS` (targets as kubectl takes them: `crd --all`,
        `node/a`, `-f FILE`), given timeout seconds."""
        return self.run("wait", f"--for={condition}", f"--timeout={timeout:.0f}s", *targets,
                        *(["-n", ns] if ns else []), timeout=timeout + 10)
