"""The chart installs from a registry the push recipe filled: a registry on the machine's loopback
(hack/images/registry.sh; its storage kept between runs, tests/images/registry.py), the operator
image pushed to it by hack/images/push.sh (what `make push` runs), and `helm install` with
operator.image naming the registry copy and pullPolicy Always: the real node's containerd pulls it
(containerd's CRI speaks plain HTTP to a loopback registry without any configuration) and the
operator pod runs and becomes Ready."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from hack import cluster as cp
from tests.images.registry import forget_tags, loopback_registry, store

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
RELEASE = NS = "rlscale-registry"
WATCHED = "rlscale-registry-runs"  # the release watches only this (empty) namespace


@pytest.fixture
def registry():
    """The kept loopback registry (tests/images/registry.py) without the operator's tags: the push
    must put its manifest again (its layers, unchanged since the last run, stay: sending layers is
    what tests/images/test_push.py proves)."""
    with loopback_registry(store("node")) as reg:
        forget_tags(reg, ["rlscale-test/operator"])
        yield reg


def test_the_chart_installs_from_the_registry_the_push_recipe_filled(node_cluster, registry):
    """`make push` (the CPU images' build, at once when they are up to date), of the operator image
    only: the one the chart's install pulls."""
    r = subprocess.run(["make", "--no-print-directory", "push", f"REGISTRY={registry}/rlscale-test", "VARIANT=cpu",
                        "TAG=t1", "PUSH_TLS_VERIFY=false"], cwd=REPO, capture_output=True, text=True, timeout=3600,
                       env={**os.environ, "RLSCALE_PUSH_ONLY": "operator"})
    assert r.returncode == 0, r.stdout + r.stderr
    ref = f"{registry}/rlscale-test/operator:t1"
    assert f"--set operator.image.repository={registry}/rlscale-test/operator --set operator.image.tag=t1" in r.stdout
    env = {**os.environ, "KUBECONFIG": str(node_cluster.kubeconfig)}
    kubectl = [str(cp.bin_dir() / "kubectl")]
    helm = str(cp.bin_dir() / "helm")
    subprocess.run([*kubectl, "create", "namespace", WATCHED], env=env, capture_output=True)
    try:
        t0 = time.monotonic()
        r = subprocess.run(
            [helm, "upgrade", "--install", RELEASE, str(REPO / "charts" / "rlscale"), "--namespace", NS,
             "--create-namespace", "--wait", "--timeout", "8m",
             "--set", f"operator.image.repository={registry}/rlscale-test/operator",
             "--set", "operator.image.tag=t1", "--set", "operator.image.pullPolicy=Always",
             "--set", "operator.replicas=1", "--set", f"operator.watchNamespaces={{{WATCHED}}}",
             "--set", f"operator.nodeSelector.{cp.REAL_NODE_LABEL.replace('.', chr(92) + '.')}=real",
             "--set", f"runImages.trainer={registry}/rlscale-test/trainer:t1-cpu",
             "--set", f"runImages.rollout={registry}/rlscale-test/rollout:t1-cpu",
             "--set", "checkpointStorage="],
            capture_output=True, text=True, timeout=600, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        pods = json.loads(subprocess.run([*kubectl, "get", "pods", "-n", NS, "-o", "json",
                                          "-l", "app.kubernetes.io/name=rlscale"],
                                         capture_output=True, text=True, env=env, check=True).stdout)["items"]
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        pod = pods[0]
        assert pod["spec"]["nodeName"] == cp.NODE_NAME  # the real node, not a kwok one
        status = pod["status"]["containerStatuses"][0]
        # The pod runs the pushed name. The status names the image as containerd does, by the first name
        # it had under that ID: a run before pulled the same image from this registry on another port
        # (seen: 127.0.0.1:55939/... for 127.0.0.1:60267/...), so only its path is the pushed one; the
        # digest and the Pulled event below show where this pull came from.
        assert pod["spec"]["containers"][0]["image"] == ref, pod["spec"]["containers"][0]["image"]
        assert status["ready"] and status["image"].endswith("/rlscale-test/operator:t1"), status
        # The node pulled it from the registry: its image ID is the registry's manifest digest.
        req = urllib.request.Request(f"http://{registry}/v2/rlscale-test/operator/manifests/t1", method="HEAD",
                                     headers={"Accept": "application/vnd.oci.image.manifest.v1+json, "
                                                        "application/vnd.docker.distribution.manifest.v2+json"})
        digest = urllib.request.urlopen(req, timeout=10).headers["Docker-Content-Digest"]
        assert status["imageID"].endswith(digest), (status["imageID"], digest)
        events = subprocess.run([*kubectl, "get", "events", "-n", NS, "-o", "json"], capture_output=True,
                                text=True, env=env, check=True).stdout
        assert any(e.get("reason") == "Pulled" and ref in e.get("message", "")
                   for e in json.loads(events)["items"]), "no Pulled event for the registry image"
        print(f"helm install from the loopback registry, operator Ready: {time.monotonic() - t0:.0f} s")
    finally:
        subprocess.run([helm, "uninstall", RELEASE, "--namespace", NS, "--wait"], env=env, capture_output=True,
                       timeout=300)
        subprocess.run([*kubectl, "delete", "namespace", NS, WATCHED, "--wait=false"], env=env, capture_output=True)
