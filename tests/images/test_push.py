"""The push recipe (`make push`, hack/images/push.sh): the names it pushes are the chart's defaults,
it refuses bad input naming the fix, and pushed to a registry this test starts on 127.0.0.1
(hack/images/registry.sh, Debian's docker-registry 2.8.2) the CPU images are there: each manifest's
config is the built image's, every layer blob is served, and the operator image pulled back from
the registry runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import yaml

from rlscale.operator import constants as C
from tests.images.test_images import HACK, REPO, TAGS, pod

CHART = REPO / "charts" / "rlscale"
MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])


def push(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(HACK / "push.sh"), *args], capture_output=True, text=True,
                          timeout=3600, env={**os.environ, **env})


def dry_run(registry: str, variant: str) -> dict[str, str]:
    r = push(registry, variant, RLSCALE_PUSH_DRY_RUN="1")
    assert r.returncode == 0, r.stderr
    pairs = dict(line.split(" -> ") for line in r.stdout.splitlines())
    return {src.split("/")[-1].split(":")[0]: dst for src, dst in pairs.items()}


def test_the_chart_defaults_are_what_the_gpu_push_to_the_project_registry_names():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    pushed = dry_run("ghcr.io/rlscale", "gpu")
    op = values["operator"]["image"]
    assert f"{op['repository']}:{op['tag'] or chart['appVersion']}" == pushed["operator"]
    assert values["runImages"] == {"trainer": pushed["trainer"], "rollout": pushed["rollout"]}
    # The operator's own fallback (no RLSCALE_TRAINER_IMAGE in its environment) names the same.
    assert (C.DEFAULT_TRAINER_IMAGE, C.DEFAULT_ROLLOUT_IMAGE) == (pushed["trainer"], pushed["rollout"])
    assert pushed["torch"] == f"ghcr.io/rlscale/torch:{chart['appVersion']}"


def test_the_cpu_variant_is_pushed_under_its_own_tags_and_the_operator_is_shared():
    cpu, gpu = dry_run("reg.example:5000/ml/rlscale", "cpu"), dry_run("reg.example:5000/ml/rlscale", "gpu")
    assert cpu["operator"] == gpu["operator"]
    for name in ("trainer", "rollout", "torch"):
        assert cpu[name] == gpu[name] + "-cpu"
    assert dict(line.split(" -> ") for line in push("r.example/x", "cpu", "1.2.3", RLSCALE_PUSH_DRY_RUN="1")
                .stdout.splitlines())[TAGS["RLSCALE_TRAINER_IMAGE"]] == "r.example/x/trainer:1.2.3-cpu"


@pytest.mark.parametrize("args,env,words", [
    ((), {}, "REGISTRY is empty"),
    (("https://reg.example/rlscale",), {}, "not host[:port]/path"),
    (("reg.example/rlscale/",), {}, "not host[:port]/path"),
    (("reg.example",), {}, "not host[:port]/path"),
    (("reg.example/rlscale", "tpu"), {}, "VARIANT must be cpu or gpu, not 'tpu'"),
    (("reg.example/rlscale", "cpu", "-bad"), {}, "TAG is '-bad'"),
    (("reg.example/rlscale",), {"RLSCALE_PUSH_TLS_VERIFY": "no"}, "RLSCALE_PUSH_TLS_VERIFY must be true or false"),
    (("reg.example/rlscale",), {"RLSCALE_PUSH_ONLY": "operator,ray"}, "RLSCALE_PUSH_ONLY names 'ray'"),
])
def test_bad_input_is_refused_naming_the_value_and_the_fix(args, env, words):
    r = push(*args, **env, RLSCALE_PUSH_DRY_RUN="1")
    assert r.returncode == 2 and words in r.stderr and r.stdout == "", (r.stdout, r.stderr)


def get(url: str, accept: str | None = None, method: str = "GET") -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(url, method=method, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A plain-http registry on a free loopback port, its blobs in a temp dir, gone afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = tmp_path_factory.mktemp("registry")
    log = open(d / "log", "w")
    p = subprocess.Popen(["bash", str(HACK / "registry.sh"), f"127.0.0.1:{port}", str(d)], stdout=log, stderr=log)
    try:
        for _ in range(600):
            try:
                if get(f"http://127.0.0.1:{port}/v2/")[0] == 200:
                    break
            except OSError:
                pass
            if p.poll() is not None:
                pytest.fail("registry.sh exited: " + (d / "log").read_text()[-2000:])
            time.sleep(0.1)
        else:
            pytest.fail("the registry did not answer on /v2/ within 60 s: " + (d / "log").read_text()[-2000:])
        yield f"127.0.0.1:{port}"
    finally:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
        log.close()
        subprocess.run(["rm", "-rf", str(d)])


def image_id(ref: str) -> str:
    r = pod("image", "inspect", "--format", "{{.Id}}", ref)
    assert r.returncode == 0, f"{ref} is not built: run `make images`\n{r.stderr}"
    return r.stdout.strip()


@pytest.mark.cluster
def test_make_push_puts_every_cpu_image_in_the_registry_and_the_operator_pulls_back(registry):
    local = {name: TAGS[f"RLSCALE_{name.upper()}_IMAGE"] for name in ("operator", "torch", "trainer", "rollout")}
    ids = {name: image_id(ref) for name, ref in local.items()}
    t0 = time.monotonic()
    r = subprocess.run(["make", "--no-print-directory", "push", f"REGISTRY={registry}/rlscale-test",
                        "VARIANT=cpu", "TAG=t1", "PUSH_TLS_VERIFY=false"],
                       cwd=REPO, capture_output=True, text=True, timeout=3600)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"--set runImages.trainer={registry}/rlscale-test/trainer:t1-cpu" in r.stdout
    print(f"make push (cpu, 4 images, empty registry): {took:.0f} s\n{r.stdout}")
    for name in local:
        tag = "t1" if name == "operator" else "t1-cpu"
        base = f"http://{registry}/v2/rlscale-test/{name}"
        status, body, _ = get(f"{base}/manifests/{tag}", MANIFEST_TYPES)
        assert status == 200, (name, status, body[:300])
        manifest = json.loads(body)
        # The registry's copy is the built image: its config blob is the one podman built (the image ID).
        assert manifest["config"]["digest"] == f"sha256:{ids[name]}", (name, manifest["config"])
        layers = json.loads(pod("image", "inspect", local[name]).stdout)[0]["RootFS"]["Layers"]
        assert len(manifest["layers"]) == len(layers) > 0
        for layer in manifest["layers"]:
            assert get(f"{base}/blobs/{layer['digest']}", method="HEAD")[0] == 200, (name, layer)
    # What a node does: pull by the pushed name (a fresh name in podman's storage), then run it.
    ref = f"{registry}/rlscale-test/operator:t1"
    try:
        r = pod("pull", "--quiet", "--tls-verify=false", ref, timeout=600)
        assert r.returncode == 0, r.stderr
        r = pod("run", "--rm", "--network", "none", ref, "--help")
        assert r.returncode == 0 and "operator" in r.stdout, r.stdout + r.stderr
    finally:
        pod("rmi", ref)
    # A second push sends no layer again (the registry has them all): it takes seconds.
    t0 = time.monotonic()
    r = push(f"{registry}/rlscale-test", "cpu", "t1", RLSCALE_PUSH_TLS_VERIFY="false")
    assert r.returncode == 0, r.stderr
    print(f"second push: {time.monotonic() - t0:.0f} s")
    assert time.monotonic() - t0 < 120
