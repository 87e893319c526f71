"""The images `make images` builds here (hack/images/build.sh): they exist under the names in
hack/images/tags.env with the expected labels and non-root users, the CPU images import what
their role needs with nothing writable but /tmp and HOME, and hack/images/load.sh puts an image
into a throwaway containerd's k8s.io namespace, where `ctr run` starts it. Warm: ~30 s."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.images.registry import end_process

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack" / "images"


def tags() -> dict[str, str]:
    out = {}
    for line in (HACK / "tags.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


TAGS = tags()


def pod(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """podman against the storage build.sh uses (hack/images/lib.sh)."""
    return subprocess.run(["bash", "-c", f'source "{HACK}/lib.sh"; pod "$@"', "pod", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def inspect() -> dict[str, dict]:
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: run `make images` (hack/images/build.sh)", pytrace=False)
    out = {}
    for key, ref in TAGS.items():
        r = pod("image", "inspect", ref)
        assert r.returncode == 0, f"{ref} is not built: run `make images`\n{r.stderr}"
        out[key] = json.loads(r.stdout)[0]
    return out


def test_tags_are_fully_qualified_and_cpu_for_the_test_cluster():
    assert set(TAGS) == {"RLSCALE_OPERATOR_IMAGE", "RLSCALE_TRAINER_IMAGE", "RLSCALE_ROLLOUT_IMAGE",
                         "RLSCALE_TORCH_IMAGE"}
    for ref in TAGS.values():
        assert ref.startswith("docker.io/rlscale/"), ref
    for key in ("RLSCALE_TRAINER_IMAGE", "RLSCALE_ROLLOUT_IMAGE", "RLSCALE_TORCH_IMAGE"):
        assert TAGS[key].endswith(":dev-cpu")


@pytest.mark.parametrize("key,role,user,home", [
    ("RLSCALE_OPERATOR_IMAGE", "operator", "65532:65532", "/home/nonroot"),
    ("RLSCALE_TRAINER_IMAGE", "trainer", "1000:1000", "/home/rlscale"),
    ("RLSCALE_ROLLOUT_IMAGE", "rollout", "1000:1000", "/home/rlscale"),
])
def test_images_have_their_labels_a_numeric_user_and_a_home(inspect, key, role, user, home):
    cfg = inspect[key]["Config"]
    labels = cfg.get("Labels") or {}
    assert labels.get("dev.rlscale.role") == role
    assert labels.get("dev.rlscale.variant") == ("any" if role == "operator" else "cpu")
    assert cfg["User"] == user
    env = dict(e.split("=", 1) for e in cfg["Env"])
    assert env["HOME"] == home
    assert cfg["Entrypoint"] == ["rlscale"]
    if role != "operator":
        assert env["TORCH_EXTENSIONS_DIR"].startswith(home + "/")
        assert labels.get("dev.rlscale.torch") == "2.13.0"


def test_trainer_and_rollout_share_the_torch_layers(inspect):
    torch_layers = inspect["RLSCALE_TORCH_IMAGE"]["RootFS"]["Layers"]
    for key in ("RLSCALE_TRAINER_IMAGE", "RLSCALE_ROLLOUT_IMAGE"):
        assert inspect[key]["RootFS"]["Layers"][:len(torch_layers)] == torch_layers


def run_ro(ref: str, *cmd: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run as the image's user on a read-only root; only /tmp (podman's default tmpfs) and a
    tmpfs HOME, standing in for the pod's emptyDir, are writable."""
    home = "/home/nonroot" if "operator" in ref else "/home/rlscale"
    return pod("run", "--rm", "--network", "none", "--read-only", "--tmpfs", f"{home}:mode=1777",
               ref, *cmd, timeout=timeout)


@pytest.mark.parametrize("key,check", [
    # The trainer runs the colocated vLLM engine too.
    ("RLSCALE_TRAINER_IMAGE", "import torch, deepspeed, vllm, ray.serve, transformers, rlscale.trainer.entrypoint, "
                              "rlscale.rollout.serve"),
    ("RLSCALE_ROLLOUT_IMAGE", "import torch, vllm, ray.serve, rlscale.rollout.entrypoint"),
])
def test_cpu_images_import_their_role_read_only(inspect, key, check):
    r = run_ro(TAGS[key], "--help")
    assert r.returncode == 0 and "rollout" in r.stdout, r.stderr
    r = pod("run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/home/rlscale:mode=1777",
            "--entrypoint", "python", TAGS[key], "-c",
            f"{check}; import shutil; assert shutil.which('g++') and shutil.which('gcc'); print('ok')")
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_smoke_the_cpu_images_refuse_a_gpu_run_without_a_gpu(inspect):
    """hack/images/smoke.sh, which the GPU variant's build is checked with too (docs/gpu.md)."""
    r = subprocess.run(["bash", str(HACK / "smoke.sh"), "cpu"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    for role in ("learner", "rollout"):
        assert f"rlscale {role} refuses without a GPU (exit 2)" in r.stdout, r.stdout


@pytest.fixture(scope="module")
def containerd(tmp_path_factory):
    """A throwaway containerd (no CRI plugin) with its root, state and socket in a temp dir."""
    if shutil.which("containerd") is None or shutil.which("ctr") is None:
        pytest.fail("containerd/ctr are not installed: run `make k8s` (Debian's containerd package)", pytrace=False)
    # On tmpfs where there is room: on the shared disk, deleting the unpacked image took 12-23 s.
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free > 4 << 30:
        import tempfile
        d = Path(tempfile.mkdtemp(prefix="rlscale-ctrd-", dir=shm))
    else:
        d = Path(tmp_path_factory.mktemp("ctrd", numbered=True))
    sock = d / "c.sock"
    (d / "config.toml").write_text(
        f'version = 2\nroot = "{d}/root"\nstate = "{d}/state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{sock}"\n[ttrpc]\n  address = "{sock}.ttrpc"\n')
    log = open(d / "log", "w")
    p = subprocess.Popen(["containerd", "--config", str(d / "config.toml")], stdout=log, stderr=log)
    try:
        for _ in range(100):
            if sock.exists() and subprocess.run(["ctr", "--address", str(sock), "version"],
                                                capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            pytest.fail("throwaway containerd did not start: " + (d / "log").read_text()[-2000:])
        yield sock
    finally:
        end_process(p, grace=5)
        log.close()
        subprocess.run(["umount", "-R", str(d / "root")], capture_output=True)
        subprocess.run(["rm", "-rf", str(d)])


def test_load_imports_once_and_ctr_runs_the_operator_image(inspect, containerd):
    ref = TAGS["RLSCALE_OPERATOR_IMAGE"]
    load = ["bash", str(HACK / "load.sh"), str(containerd), ref]
    r = subprocess.run(load, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "(1 imported)" in r.stdout, r.stdout + r.stderr
    t0 = time.monotonic()
    r = subprocess.run(load, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "(0 imported)" in r.stdout, r.stdout + r.stderr
    assert time.monotonic() - t0 < 10
    ctr = ["ctr", "--address", str(containerd), "-n", "k8s.io"]
    ls = subprocess.run([*ctr, "images", "ls", f"name=={ref}"], capture_output=True, text=True)
    assert ref in ls.stdout
    r = subprocess.run([*ctr, "run", "--rm", "--runtime", "io.containerd.runc.v2", ref,
                        f"imgtest-{os.getpid()}", "sh", "-c", "id -u; rlscale --help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "65532" and "operator" in r.stdout


def test_a_rebuild_replaces_the_previous_build_and_a_failed_import_is_retried(inspect, containerd, tmp_path):
    """A rebuild shares its base layers with the build the node has (as every `make images`
    after a code change does): the import reuses their snapshots while the previous build keeps
    a second name, which is gone afterwards. An import that fails once (a race with containerd's
    garbage collection, seen in CI) is retried after a collection."""
    ref = "localhost/rlscale-test/rebuild:dev"
    base = TAGS["RLSCALE_OPERATOR_IMAGE"]
    ctr = ["ctr", "--address", str(containerd), "-n", "k8s.io"]

    def build(marker: str) -> None:
        (tmp_path / "marker").write_text(marker)
        (tmp_path / "Containerfile").write_text(f"FROM {base}\nCOPY marker /marker\n")
        r = pod("build", "--quiet", "--pull=never", "-t", ref, str(tmp_path), timeout=300)
        assert r.returncode == 0, r.stderr

    def names() -> str:
        return subprocess.run([*ctr, "images", "ls", "-q"], capture_output=True, text=True).stdout

    # RLSCALE_CTR: a ctr whose first `images import` fails once, after reading its input.
    fail_once = tmp_path / "ctr-fails-once"
    fail_once.write_text(
        "#!/usr/bin/env bash\n"
        f'if [[ " $* " == *" images import "* && ! -e {tmp_path}/failed ]]; then\n'
        f"  touch {tmp_path}/failed; cat >/dev/null; echo 'ctr: simulated failure' >&2; exit 1\nfi\n"
        'exec ctr "$@"\n')
    fail_once.chmod(0o755)
    try:
        build("first")
        r = subprocess.run(["bash", str(HACK / "load.sh"), str(containerd), ref],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "(1 imported)" in r.stdout, r.stdout + r.stderr
        build("second")
        r = subprocess.run(["bash", str(HACK / "load.sh"), str(containerd), ref], capture_output=True,
                           text=True, timeout=300, env={**os.environ, "RLSCALE_CTR": str(fail_once)})
        assert r.returncode == 0 and "(1 imported)" in r.stdout, r.stdout + r.stderr
        assert "import failed, collecting garbage and importing again: ctr: simulated failure" in r.stdout
        assert "previous-build" not in names()
        r = subprocess.run([*ctr, "run", "--rm", "--runtime", "io.containerd.runc.v2", ref,
                            f"imgtest-rebuild-{os.getpid()}", "cat", "/marker"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout == "second", r.stdout + r.stderr
    finally:
        pod("rmi", "--force", ref)
        subprocess.run([*ctr, "images", "rm", ref], capture_output=True)
