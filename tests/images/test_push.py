"""The push recipe (`make push`, hack/images/push.sh): the names it pushes are the chart's defaults,
it refuses bad input naming the fix, and pushed to a registry this test starts on 127.0.0.1
(hack/images/registry.sh, Debian's docker-registry 2.8.2) the CPU images are there: each manifest's
config is the built image's, every layer blob is served, and the operator image pulled back from
the registry runs. The registry's storage is kept between runs (tests/images/registry.py): a warm
run pushes the layers that changed since, and at least the operator's top layer and config, which
it makes the registry forget first."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import yaml

from rlscale.operator import constants as C
from tests.images.registry import MANIFEST_TYPES, drop_blobs, forget_tags, loopback_registry, manifest, store
from tests.images.registry import http as get
from tests.images.test_images import HACK, REPO, TAGS, pod

CHART = REPO / "charts" / "rlscale"
REPO_PATH = "rlscale-test"  # the repositories' path in the registry: REGISTRY=<registry>/rlscale-test
IMAGES = ("operator", "torch", "trainer", "rollout")


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


def test_make_push_without_a_registry_fails_before_it_builds():
    t0 = time.monotonic()
    r = subprocess.run(["make", "--no-print-directory", "push", "REGISTRY=", "VARIANT=cpu"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "REGISTRY is empty" in r.stderr, r.stdout + r.stderr
    assert "[images]" not in r.stdout and time.monotonic() - t0 < 30


@pytest.fixture(scope="module")
def registry():
    """The kept loopback registry (tests/images/registry.py), with what the push must send again
    forgotten: every tag of the four repositories, and the operator image's top layer and config as
    the last push left them. Yields its address and the operator's blobs it still held."""
    with loopback_registry(store("push")) as reg:
        last = manifest(reg, f"{REPO_PATH}/operator", "t1")
        forget_tags(reg, [f"{REPO_PATH}/{name}" for name in IMAGES])
        held = set()
        if last:
            dropped = [last[1]["layers"][-1]["digest"], last[1]["config"]["digest"]]
            drop_blobs(reg, f"{REPO_PATH}/operator", dropped)
            held = {layer["digest"] for layer in last[1]["layers"]} - set(dropped)
        yield reg, held


def image_id(ref: str) -> str:
    r = pod("image", "inspect", "--format", "{{.Id}}", ref)
    assert r.returncode == 0, f"{ref} is not built: run `make images`\n{r.stderr}"
    return r.stdout.strip()


@pytest.mark.cluster
def test_make_push_puts_every_cpu_image_in_the_registry_and_the_operator_pulls_back(registry):
    """On a kept registry (warm) the push sends the layers it lacks: at least the operator's top
    layer and config, which the fixture made it forget; on an empty one (cold), every layer."""
    registry, held_before = registry
    local = {name: TAGS[f"RLSCALE_{name.upper()}_IMAGE"] for name in IMAGES}
    ids = {name: image_id(ref) for name, ref in local.items()}
    t0 = time.monotonic()
    r = subprocess.run(["make", "--no-print-directory", "push", f"REGISTRY={registry}/{REPO_PATH}",
                        "VARIANT=cpu", "TAG=t1", "PUSH_TLS_VERIFY=false"],
                       cwd=REPO, capture_output=True, text=True, timeout=3600)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"--set runImages.trainer={registry}/{REPO_PATH}/trainer:t1-cpu" in r.stdout
    print(f"make push (cpu, 4 images, {'kept' if held_before else 'empty'} registry): {took:.0f} s\n{r.stdout}")
    for name in local:
        tag = "t1" if name == "operator" else "t1-cpu"
        base = f"http://{registry}/v2/{REPO_PATH}/{name}"
        status, body, _ = get(f"{base}/manifests/{tag}", MANIFEST_TYPES)
        assert status == 200, (name, status, body[:300])
        pushed = json.loads(body)
        # The registry's copy is the built image: its config blob is the one podman built (the image ID).
        assert pushed["config"]["digest"] == f"sha256:{ids[name]}", (name, pushed["config"])
        layers = json.loads(pod("image", "inspect", local[name]).stdout)[0]["RootFS"]["Layers"]
        assert len(pushed["layers"]) == len(layers) > 0
        for layer in pushed["layers"]:
            assert get(f"{base}/blobs/{layer['digest']}", method="HEAD")[0] == 200, (name, layer)
        if name == "operator":
            # Served now, not held before: this push sent it.
            assert pushed["layers"][-1]["digest"] not in held_before, (pushed["layers"][-1], held_before)
    # What a node does: pull by the pushed name (a fresh name in podman's storage), then run it.
    ref = f"{registry}/{REPO_PATH}/operator:t1"
    try:
        r = pod("pull", "--quiet", "--tls-verify=false", ref, timeout=600)
        assert r.returncode == 0, r.stderr
        r = pod("run", "--rm", "--network", "none", ref, "--help")
        assert r.returncode == 0 and "operator" in r.stdout, r.stdout + r.stderr
    finally:
        pod("rmi", ref)
    # A second push sends no layer again (the registry has them all): it takes seconds.
    t0 = time.monotonic()
    r = push(f"{registry}/{REPO_PATH}", "cpu", "t1", RLSCALE_PUSH_TLS_VERIFY="false")
    assert r.returncode == 0, r.stderr
    print(f"second push: {time.monotonic() - t0:.0f} s")
    assert time.monotonic() - t0 < 120


def put_blob(registry: str, repo: str, data: bytes) -> dict:
    """A blob uploaded in one PUT through the registry's API; its descriptor."""
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    status, _, headers = get(f"http://{registry}/v2/{repo}/blobs/uploads/", method="POST")
    assert status == 202, status
    loc = headers["Location"]
    loc = loc if loc.startswith("http") else f"http://{registry}{loc}"
    req = urllib.request.Request(f"{loc}{'&' if '?' in loc else '?'}digest={digest}", data=data, method="PUT",
                                 headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 201
    return {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest, "size": len(data)}


def put_manifest(registry: str, repo: str, tag: str, config: dict, layers: list[dict]) -> int:
    body = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {**config, "mediaType": "application/vnd.oci.image.config.v1+json"},
                       "layers": layers}).encode()
    req = urllib.request.Request(f"http://{registry}/v2/{repo}/manifests/{tag}", data=body, method="PUT",
                                 headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_kept_registry_forgets_what_a_push_must_send_and_keeps_only_tagged_images(tmp_path):
    """tests/images/registry.py on the real registry (a tiny image put through its HTTP API, no podman):
    forgotten tags make a push put its manifest again; a dropped layer must be sent again before the
    registry takes the manifest; the garbage collection after the registry stops deletes what no tag names."""
    d, repo = tmp_path / "store", "t/img"
    blobs = d / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256"
    with loopback_registry(d) as reg:
        config, layer, orphan = (put_blob(reg, repo, x) for x in (b'{"architecture": "amd64"}', b"layer", b"old"))
        assert put_manifest(reg, repo, "a", config, [layer]) == 201
        forget_tags(reg, [repo, "t/never-pushed"])
        assert manifest(reg, repo, "a") is None
        assert get(f"http://{reg}/v2/{repo}/blobs/{layer['digest']}", method="HEAD")[0] == 200  # layers stay
        drop_blobs(reg, repo, [layer["digest"]])
        assert put_manifest(reg, repo, "a", config, [layer]) == 400  # MANIFEST_BLOB_UNKNOWN: send it first
        put_blob(reg, repo, b"layer")
        assert put_manifest(reg, repo, "a", config, [layer]) == 201
    kept = {p.name for p in blobs.glob("*/*")}
    assert {config["digest"][7:], layer["digest"][7:]} <= kept and orphan["digest"][7:] not in kept, kept
    # Started again at once (its port still in TIME_WAIT from the connections above): the same port, which
    # podman's blob-info cache knows the layers by.
    with loopback_registry(d) as again:
        assert again == reg and manifest(again, repo, "a") is not None
