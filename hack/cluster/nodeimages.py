"""Tiny container images for the real node, built without a container engine: OCI image
archives (one uncompressed layer) that `ctr images import` loads into the node's containerd.

- the pod sandbox image (pause.c compiled static with gcc),
- a busybox image from Debian's busybox-static binary (tests, debugging).

Stdlib only (plain python3 runs `python -m hack.cluster`, which imports it)."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAUSE_IMAGE = "rlscale.local/pause:1"
BUSYBOX_IMAGE = "rlscale.local/busybox:1"
BUSYBOX_BIN = Path("/bin/busybox")
# Applets the tests and a debugging shell use; each is a symlink to /bin/busybox.
BUSYBOX_APPLETS = ["sh", "ls", "cat", "echo", "sleep", "wget", "nslookup", "httpd", "hostname",
                   "env", "ip", "ifconfig", "ps", "mkdir", "printf", "grep", "true", "false", "nc",
                   "id", "date", "test", "head", "tail", "wc", "timeout"]


class ImageError(RuntimeError):
    pass


def _blob(blobs: dict[str, bytes], data: bytes, media: str) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media, "digest": digest, "size": len(data)}


def _layer(files: dict[str, tuple[bytes, int]], links: dict[str, str], dirs: list[str]) -> bytes:
    """A reproducible tar: fixed mtimes and owners, sorted entries."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(set(dirs)):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(ti)
        for name in sorted(files):
            data, mode = files[name]
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), mode
            tar.addfile(ti, io.BytesIO(data))
        for name in sorted(links):
            ti = tarfile.TarInfo(name)
            ti.type, ti.linkname, ti.mode = tarfile.SYMTYPE, links[name], 0o777
            tar.addfile(ti)
    return buf.getvalue()


def write_archive(out: Path, ref: str, files: dict[str, tuple[bytes, int]], *,
                  links: dict[str, str] | None = None, dirs: list[str] | None = None,
                  entrypoint: list[str] | None = None, cmd: list[str] | None = None,
                  env: list[str] | None = None) -> str:
    """Write an OCI image archive of one layer to out; return the manifest digest."""
    layer = _layer(files, links or {}, dirs or [])
    blobs: dict[str, bytes] = {}
    ldesc = _blob(blobs, layer, "application/vnd.oci.image.layer.v1.tar")
    config = {
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "Cmd": cmd,
                   "Env": env or ["PATH=/bin:/usr/bin:/sbin:/usr/sbin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [ldesc["digest"]]},
        "history": [{"created_by": "rlscale hack/cluster/nodeimages.py"}],
    }
    cdesc = _blob(blobs, json.dumps(config, sort_keys=True).encode(),
                  "application/vnd.oci.image.config.v1+json")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": cdesc, "layers": [ldesc]}
    mdesc = _blob(blobs, json.dumps(manifest, sort_keys=True).encode(),
                  "application/vnd.oci.image.manifest.v1+json")
    # containerd names the imported image after io.containerd.image.name.
    mdesc = {**mdesc, "platform": {"architecture": "amd64", "os": "linux"},
             "annotations": {"io.containerd.image.name": ref,
                             "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1]}}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [mdesc]}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        def add(name: str, data: bytes) -> None:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), 0o644
            tar.addfile(ti, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index).encode())
        for digest, data in blobs.items():
            add(f"blobs/sha256/{digest.split(':', 1)[1]}", data)
    tmp.replace(out)
    return mdesc["digest"]


def build_pause(out: Path) -> str:
    """The sandbox image: pause.c compiled static (gcc and libc6-dev, see node-deps.sh)."""
    if not shutil.which("gcc"):
        raise ImageError("gcc is needed to build the pause image: run hack/cluster/node-deps.sh")
    with tempfile.TemporaryDirectory() as td:
        exe = Path(td) / "pause"
        r = subprocess.run(["gcc", "-static", "-O2", "-Wall", "-o", str(exe), str(HERE / "node" / "pause.c")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise ImageError(f"gcc pause.c failed: {r.stderr.strip()}")
        subprocess.run(["strip", str(exe)], check=False)
        return write_archive(out, PAUSE_IMAGE, {"pause": (exe.read_bytes(), 0o755)}, entrypoint=["/pause"])


def busybox_files(extra: dict[str, tuple[bytes, int]] | None = None) -> tuple[dict, dict, list]:
    """Files, symlinks and dirs of a busybox root filesystem (plus extra files)."""
    if not BUSYBOX_BIN.exists():
        raise ImageError(f"{BUSYBOX_BIN} missing: run hack/cluster/node-deps.sh (busybox-static)")
    files = {"bin/busybox": (BUSYBOX_BIN.read_bytes(), 0o755),
             "etc/passwd": (b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n", 0o644),
             "etc/group": (b"root:x:0:\nnobody:x:65534:\n", 0o644)}
    files.update(extra or {})
    links = {f"bin/{a}": "busybox" for a in BUSYBOX_APPLETS}
    return files, links, ["bin", "etc", "tmp", "root", "var", "www"]


def build_busybox(out: Path, ref: str = BUSYBOX_IMAGE, extra: dict[str, tuple[bytes, int]] | None = None) -> str:
    files, links, dirs = busybox_files(extra)
    return write_archive(out, ref, files, links=links, dirs=dirs, cmd=["/bin/sh"])


def ctr(socket: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["ctr", f"--address={socket}", "--namespace=k8s.io", *args],
                          capture_output=True, text=True, timeout=timeout)


def image_digest(socket: Path, ref: str) -> str | None:
    """The target digest of ref in the node's containerd, or None."""
    r = ctr(socket, "images", "ls", f"name=={ref}")
    lines = r.stdout.splitlines()[1:] if r.returncode == 0 else []
    for line in lines:
        cols = line.split()
        if cols and cols[0] == ref:
            return next((c for c in cols if c.startswith("sha256:")), None)
    return None


def import_archive(socket: Path, archive: Path, ref: str, digest: str | None = None) -> None:
    """ctr images import, skipped when ref already points at digest."""
    if digest and image_digest(socket, ref) == digest:
        return
    r = ctr(socket, "images", "import", str(archive))
    if r.returncode != 0:
        raise ImageError(f"ctr images import {archive} failed: {r.stderr.strip()}")
    if image_digest(socket, ref) is None:
        raise ImageError(f"ctr imported {archive} but {ref} is not listed: {r.stdout.strip()}")
