"""The loopback registry the push tests fill (hack/images/registry.sh), its storage kept between runs
under ~/.cache/rlscale/test-registry/<name> as podman's images are: a warm `make push` then finds every
layer it pushed last time and sends only what changed (the push of the CPU images gzips 7.3 GB of torch
layers on the way, most of the push test's minutes), as it does against a real registry. Each test
first makes the registry forget what it must see pushed again (`forget_tags`, `drop_blobs`); after it,
`garbage-collect --delete-untagged` keeps only the images last pushed under each tag, so the storage holds
one set of the images rather than every build's."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

HACK = Path(__file__).resolve().parents[2] / "hack" / "images"
MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])


def store(name: str) -> Path:
    return Path(os.environ.get("RLSCALE_CACHE") or Path.home() / ".cache" / "rlscale") / "test-registry" / name


def http(url: str, accept: str | None = None, method: str = "GET") -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(url, method=method, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


@contextmanager
def loopback_registry(d: Path) -> Iterator[str]:
    """hack/images/registry.sh on a free 127.0.0.1 port over the storage folder `d` (one test session at a
    time holds it); yields host:port; stops it and collects its garbage afterwards."""
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "lock", "w") as lock, open(d / "registry.log", "w") as log:
        fcntl.flock(lock, fcntl.LOCK_EX)
        port = kept_port(d / "port")
        p = subprocess.Popen(["bash", str(HACK / "registry.sh"), f"127.0.0.1:{port}", str(d)], stdout=log,
                             stderr=log)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if http(f"http://127.0.0.1:{port}/v2/")[0] == 200:
                        break
                except OSError:
                    pass
                if p.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"registry.sh did not answer on /v2/ (exit {p.poll()}): "
                                + (d / "registry.log").read_text()[-2000:], pytrace=False)
                time.sleep(0.1)
            yield f"127.0.0.1:{port}"
        finally:
            end_process(p, grace=10)
            gc = subprocess.run(["bash", str(HACK / "registry.sh"), "gc", str(d)], capture_output=True, text=True,
                                timeout=600)
            assert gc.returncode == 0, f"registry.sh gc {d}: {gc.stderr[-2000:]}"


def end_process(p: subprocess.Popen, grace: float) -> None:
    """SIGTERM, then SIGKILL what is left after grace seconds."""
    p.terminate()
    try:
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=10)


def kept_port(path: Path) -> int:
    """The port the registry listened on last time (kept in `path`) if it is free, else a free one (kept
    for next time). podman's blob-info cache, which tells a push the layers a registry already holds,
    keys them by the registry's host:port (a new port: every layer compressed and sent again)."""
    try:
        wanted = int(path.read_text())
    except (OSError, ValueError):
        wanted = 0
    with socket.socket() as s:
        # As the registry binds it (Go sets SO_REUSEADDR): the port's connections of the last run, still
        # in TIME_WAIT for a minute, do not make it taken (without it the run after was given a new port).
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", wanted))
        except OSError:  # taken by something else now
            s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path.write_text(str(port))
    return port


def manifest(registry: str, repo: str, ref: str) -> tuple[str, dict] | None:
    """(digest, manifest) of repo:ref, or None where the registry has none."""
    status, body, headers = http(f"http://{registry}/v2/{repo}/manifests/{ref}", MANIFEST_TYPES)
    return (headers["Docker-Content-Digest"], json.loads(body)) if status == 200 else None


def forget_tags(registry: str, repos: list[str]) -> None:
    """Delete every tagged manifest of the repositories (their tags go with them), so a push must put
    each manifest again; the layers stay."""
    for repo in repos:
        status, body, _ = http(f"http://{registry}/v2/{repo}/tags/list")
        for tag in (json.loads(body).get("tags") or []) if status == 200 else []:
            found = manifest(registry, repo, tag)
            if found:
                status, body, _ = http(f"http://{registry}/v2/{repo}/manifests/{found[0]}", method="DELETE")
                assert status in (202, 404), (repo, tag, status, body[:300])
        status, body, _ = http(f"http://{registry}/v2/{repo}/tags/list")
        assert status == 404 or not json.loads(body).get("tags"), (repo, status, body[:300])


def drop_blobs(registry: str, repo: str, digests: list[str]) -> None:
    """Unlink blobs from a repository: a push to it must send them again."""
    for digest in digests:
        status, body, _ = http(f"http://{registry}/v2/{repo}/blobs/{digest}", method="DELETE")
        assert status in (202, 404), (repo, digest, status, body[:300])
        assert http(f"http://{registry}/v2/{repo}/blobs/{digest}", method="HEAD")[0] == 404, (repo, digest)
