"""The local cluster's package without a cluster: it imports only the standard library (plain
python3 runs its command line before the venv exists), the kubectl helper's commands, and the
state file a running cluster is found by."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hack import cluster as hc
from tests.conftest import ROOT

# Run with -S (no site-packages): a third-party import fails outright; the rest is checked by name.
STDLIB_ONLY = ("import sys; before = set(sys.modules); import hack.cluster, hack.cluster.__main__; "
               "extra = sorted({m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)"
               " - {'hack'}); assert not extra, extra; print('stdlib only')")


@pytest.mark.parametrize("python", [sys.executable, sys.base_prefix + "/bin/python3"], ids=["venv", "bare"])
def test_the_package_and_its_command_line_import_only_the_standard_library(python, tmp_path):
    # As down.sh runs it: the root on PYTHONPATH, started in another folder.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([python, "-S", "-P", "-c", STDLIB_ONLY], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "stdlib only" in r.stdout, r.stderr[-2000:]
    r = subprocess.run([python, "-S", "-P", "-m", "hack.cluster", "status", "--dir", "nothing-here"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.strip() == "not running", r.stderr[-2000:]


class FakeCluster:
    """Records kubectl's arguments; answers NotFound for the object `missing`."""

    def __init__(self):
        self.calls: list[tuple[tuple[str, ...], str | None]] = []

    def kubectl(self, *args, input=None, check=True, timeout=60):
        self.calls.append((args, input))
        if "missing" in args:
            return subprocess.CompletedProcess(args, 1, "", 'Error from server (NotFound): pods "missing" not found')
        if "broken" in args:
            return subprocess.CompletedProcess(args, 1, "", "error: the server doesn't have a resource type")
        return subprocess.CompletedProcess(args, 0, '{"kind": "Pod"}', "")


def test_the_kubectl_helper_says_what_kubectl_is_asked():
    fake = FakeCluster()
    kube = hc.Kube(fake)
    assert kube.get("pod", "p", "ns", selector="a=b") == {"kind": "Pod"}
    assert fake.calls[-1][0] == ("get", "pod", "p", "-o", "json", "-n", "ns", "-l", "a=b")
    assert kube.get("pod", "missing", "ns") is None
    with pytest.raises(hc.ClusterError, match="resource type"):
        kube.get("broken")
    kube.apply({"kind": "Pod"}, "ns")
    assert fake.calls[-1] == (("apply", "-f", "-", "-n", "ns"), '{"kind": "Pod"}')
    kube.apply([{"kind": "A"}, {"kind": "B"}], server_side=True)
    args, text = fake.calls[-1]
    assert args == ("apply", "--server-side", "-f", "-")
    assert json.loads(text) == {"apiVersion": "v1", "kind": "List", "items": [{"kind": "A"}, {"kind": "B"}]}
    kube.patch("rlrun", "r", "ns", {"spec": {"suspend": True}})
    assert fake.calls[-1][0] == ("patch", "rlrun", "r", "-n", "ns", "--type=merge", "-p",
                                 '{"spec": {"suspend": true}}')
    kube.wait("condition=Established", "crd", "--all", timeout=60)
    assert fake.calls[-1][0] == ("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")


def test_the_state_file_round_trips_every_field(tmp_path):
    c = hc.Cluster(dir=tmp_path, etcd_port=1, api_port=2, nodes=3, pids={"etcd": 4}, real_node=True,
                   host=hc.NODE_IP, ports={"coredns-ready": 5})
    c.save()
    saved = json.loads((tmp_path / "state.json").read_text())
    assert saved["dir"] == str(tmp_path) and saved["pids"] == {"etcd": 4}
    assert hc.Cluster.load(tmp_path) == c
    assert c.server == f"https://{hc.NODE_IP}:2" and c.kubeconfig == tmp_path / "admin.kubeconfig"
    assert hc.Cluster.load(tmp_path / "none") is None
    assert hc.down(tmp_path / "none") is False


def test_fake_nodes_are_tainted_only_beside_a_real_node():
    alone, beside = hc.node_manifest("n", 8), hc.node_manifest("n", 8, beside_real_node=True)
    assert alone["spec"] == {} and beside["spec"]["taints"][0]["effect"] == "PreferNoSchedule"
    assert alone["status"]["capacity"][hc.GPU_RESOURCE] == "8"


def test_the_shell_scripts_run_the_package():
    for script in ("up.sh", "down.sh"):
        text = (Path(hc.__file__).parent / script).read_text()
        assert "-m hack.cluster" in text and "controlplane.py" not in text
