"""The README's Kubernetes path as functions, for the end-to-end test and the bench: the images
built here and loaded into the real node, the chart installed with the local values, and the
two claims examples/quickstart-k8s.yaml names, bound to hostPath volumes on this machine."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
OPERATOR_NS = "rlscale-system"
VALUES = REPO / "examples" / "cluster" / "values-local.yaml"
SPEC = REPO / "examples" / "quickstart-k8s.yaml"


def image_tags() -> dict[str, str]:
    """hack/images/tags.env as a mapping (RLSCALE_OPERATOR_IMAGE, ...)."""
    out = {}
    for line in (REPO / "hack" / "images" / "tags.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def build_and_load_images(containerd_socket: str) -> dict[str, str]:
    """`make images` then hack/images/load.sh into the node (each seconds when nothing changed)."""
    for cmd in (["bash", str(REPO / "hack/images/build.sh")],
                ["bash", str(REPO / "hack/images/load.sh"), containerd_socket]):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return image_tags()


def helm_install(helm: Path, kubeconfig: Path) -> None:
    """`helm install rlscale charts/rlscale -n rlscale-system -f examples/cluster/values-local.yaml`."""
    cmd = [str(helm), "upgrade", "--install", "rlscale", str(REPO / "charts" / "rlscale"),
           "--namespace", OPERATOR_NS, "--create-namespace", "-f", str(VALUES), "--wait", "--timeout", "5m"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=400,
                         env={**os.environ, "KUBECONFIG": str(kubeconfig)})
    if out.returncode != 0:
        raise RuntimeError(f"helm install failed:\n{out.stdout}\n{out.stderr}")


def namespace(name: str) -> dict:
    """A namespace whose pods the restricted Pod Security Standard checks: the operator refuses to run
    an RLRun in a namespace that enforces none (or one weaker than its chart's policy asks for)."""
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}


def claims(namespace: str, models: Path, checkpoints: Path) -> list[dict]:
    """PersistentVolumes (hostPath) bound to the claims rlscale-models and rlscale-checkpoints."""
    out = []
    for name, path in (("rlscale-models", models), ("rlscale-checkpoints", checkpoints)):
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)  # the run's images run as a non-root user
        pv = f"{namespace}-{name}"
        out += [
            {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
             "spec": {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteMany"],
                      "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "rlscale-local",
                      "hostPath": {"path": str(path)}, "claimRef": {"namespace": namespace, "name": name}}},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": namespace},
             "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "rlscale-local", "volumeName": pv,
                      "resources": {"requests": {"storage": "5Gi"}}}},
        ]
    return out


def model_cache() -> Path:
    """The models claim's folder: kept across runs, so the builtin model is built into it once."""
    return Path(os.environ.get("RLSCALE_CACHE") or Path.home() / ".cache" / "rlscale") / "k8s-models"


def quickstart(**spec_over) -> dict:
    """examples/quickstart-k8s.yaml at its smallest, what the suite's other runs and the benches build
    on: no namespace (they apply it with -n), one pod of each role with one rank, the placement left
    to the planner, no export; then spec sections updated (e.g. budget={"maxSteps": 60})."""
    obj = yaml.safe_load(SPEC.read_text())
    obj["metadata"].pop("namespace", None)
    spec = obj["spec"]
    for key in ("placement", "export"):
        spec.pop(key, None)
    spec["rollout"]["replicas"] = 1
    spec["learner"].update(replicas=1, ranksPerReplica=1)
    for k, v in spec_over.items():
        obj["spec"][k] = {**obj["spec"].get(k, {}), **v} if isinstance(v, dict) else v
    return obj
