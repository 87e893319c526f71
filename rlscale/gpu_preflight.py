"""GPU fail-fast: before a GPU role starts Ray, vLLM or DeepSpeed, check that this container sees
its GPUs and a driver new enough for the images' CUDA 13 wheels (R580+), and say which is missing.

Torch-free (the core imports no torch): the driver is read through NVML with ctypes
(libnvidia-ml.so.1, nvmlSystemGetDriverVersion) or from /proc/driver/nvidia/version. Every input
(the /dev directory, the /proc file, the library directories, the NVML query) can be injected, so
the checks are plain functions tested with fake files (tests/core/test_gpu_preflight.py).
Entrypoints exit with EXIT_CODE (2, a configuration error) on GPUPreflightError."""

from __future__ import annotations

import ctypes
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

EXIT_CODE = 2
MIN_DRIVER: tuple[int, ...] = (580,)  # CUDA 13.0 needs an R580 driver or newer
# GKE's NVIDIA driver installer mounts the driver's user-space libraries here (not in the
# loader's default path; the images put it on LD_LIBRARY_PATH), then the usual distro places.
DRIVER_LIB_DIRS: tuple[str, ...] = (
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
)
PROC_VERSION = "/proc/driver/nvidia/version"
LIBCUDA = "libcuda.so.1"
LIBNVML = "libnvidia-ml.so.1"
FIX_NO_GPU = ("give the pod GPUs (resources.limits nvidia.com/gpu on a GPU node with the NVIDIA device plugin) "
              "and run it with the NVIDIA container runtime; on GKE the driver's libraries are mounted at "
              "/usr/local/nvidia/lib64, which must be on LD_LIBRARY_PATH (the rlscale images set it)")


class GPUPreflightError(RuntimeError):
    """This container cannot run the GPU role; the message names the cause and the fix."""

    exit_code = EXIT_CODE


@dataclass
class NvmlInfo:
    driver: str | None = None  # e.g. "580.65.06"
    devices: int | None = None
    error: str | None = None  # why NVML could not be asked


@dataclass
class GPUFacts:
    """What this container shows of its GPUs."""

    device_nodes: list[str] = field(default_factory=list)  # /dev/nvidia0, /dev/nvidia1, ...
    libcuda: str | None = None
    libnvml: str | None = None
    driver: tuple[int, ...] | None = None
    driver_text: str | None = None
    driver_source: str | None = None  # "NVML" or the /proc file
    nvml: NvmlInfo = field(default_factory=NvmlInfo)
    visible_devices: str | None = None  # $CUDA_VISIBLE_DEVICES as found
    lib_dirs: list[str] = field(default_factory=list)


def parse_version(text: str) -> tuple[int, ...] | None:
    """The parts of a version string, "580.65.06" -> (580, 65, 6); None for anything else."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)*)\s*", text or "")
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def parse_proc_version(text: str) -> str | None:
    """The driver version from /proc/driver/nvidia/version's NVRM line, e.g. from
    'NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 06:54:38 UTC 2025' or
    'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build ...'."""
    for line in (text or "").splitlines():
        if line.startswith("NVRM version:"):
            m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)\b", line)
            if m:
                return m.group(1)
    return None


def format_version(v: Sequence[int]) -> str:
    return ".".join(str(p) for p in v)


def device_nodes(dev_dir: str | os.PathLike = "/dev") -> list[str]:
    """The GPU device files (/dev/nvidiaN; not nvidiactl or nvidia-uvm) in `dev_dir`."""
    try:
        names = os.listdir(dev_dir)
    except OSError:
        return []
    nodes = [n for n in names if re.fullmatch(r"nvidia\d+", n)]
    return [str(Path(dev_dir) / n) for n in sorted(nodes, key=lambda n: int(n[6:]))]


def library_dirs(env: dict[str, str] | None = None, extra: Iterable[str] = DRIVER_LIB_DIRS) -> list[str]:
    """Where to look for the driver's libraries: $LD_LIBRARY_PATH's entries, then `extra`."""
    env = os.environ if env is None else env
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    return list(dict.fromkeys([*dirs, *extra]))


def find_library(name: str, dirs: Iterable[str]) -> str | None:
    """The first `dirs/name` that exists."""
    for d in dirs:
        p = Path(d) / name
        if p.exists():
            return str(p)
    return None


def ldconfig_lookup(name: str) -> str | None:
    """`name` (libcuda.so.1) as the dynamic loader's cache knows it (ldconfig -p), for drivers installed
    outside DRIVER_LIB_DIRS; None when it does not."""
    import ctypes.util

    found = ctypes.util.find_library(name[3:].split(".so")[0])  # libcuda.so.1 -> cuda
    return found if found and found.startswith(name.split(".so")[0]) else None


def query_nvml(path: str) -> NvmlInfo:
    """Driver version and device count from NVML (the library at `path`), through ctypes."""
    try:
        nvml = ctypes.CDLL(path)
    except OSError as exc:
        return NvmlInfo(error=f"cannot load {path}: {exc}")
    rc = nvml.nvmlInit_v2()
    if rc != 0:
        return NvmlInfo(error=f"nvmlInit_v2 returned {rc}{_nvml_error(nvml, rc)}")
    try:
        buf = ctypes.create_string_buffer(96)
        rc = nvml.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(len(buf)))
        driver = buf.value.decode() if rc == 0 else None
        count = ctypes.c_uint(0)
        rc2 = nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
        err = None if rc2 == 0 else f"nvmlDeviceGetCount_v2 returned {rc2}{_nvml_error(nvml, rc2)}"
        return NvmlInfo(driver=driver, devices=int(count.value) if rc2 == 0 else None, error=err)
    finally:
        nvml.nvmlShutdown()


def _nvml_error(nvml, rc: int) -> str:
    try:
        nvml.nvmlErrorString.restype = ctypes.c_char_p
        return f" ({nvml.nvmlErrorString(rc).decode()})"
    except Exception:  # an old or odd NVML: the number alone
        return ""


def gather(dev_dir: str | os.PathLike = "/dev", proc_version: str | os.PathLike = PROC_VERSION,
           lib_dirs: Sequence[str] | None = None, nvml: Callable[[str], NvmlInfo] = query_nvml,
           env: dict[str, str] | None = None,
           ldconfig: Callable[[str], str | None] | None = ldconfig_lookup) -> GPUFacts:
    """Everything the checks look at, from the given places (the real ones by default; ldconfig=None:
    the library directories only)."""
    env = os.environ if env is None else env
    dirs = library_dirs(env) if lib_dirs is None else list(lib_dirs)

    def lib(name: str) -> str | None:
        return find_library(name, dirs) or (ldconfig(name) if ldconfig else None)

    facts = GPUFacts(device_nodes=device_nodes(dev_dir), libcuda=lib(LIBCUDA), libnvml=lib(LIBNVML),
                     visible_devices=env.get("CUDA_VISIBLE_DEVICES"), lib_dirs=dirs)
    if facts.libnvml:
        facts.nvml = nvml(facts.libnvml)
        if facts.nvml.driver and parse_version(facts.nvml.driver):
            facts.driver_text, facts.driver_source = facts.nvml.driver, "NVML"
    if facts.driver_text is None:
        try:
            text = parse_proc_version(Path(proc_version).read_text())
        except OSError:
            text = None
        if text:
            facts.driver_text, facts.driver_source = text, str(proc_version)
    facts.driver = parse_version(facts.driver_text) if facts.driver_text else None
    return facts


def problems(facts: GPUFacts, expected_gpus: int, min_driver: tuple[int, ...] = MIN_DRIVER) -> list[str]:
    """Why this container cannot run a role that needs `expected_gpus` GPUs (empty: it can)."""
    out: list[str] = []
    where = ", ".join(facts.lib_dirs) or "(no directories)"
    if not facts.device_nodes and not facts.libcuda:
        out.append(f"no GPU is visible: no /dev/nvidia[0-9] device and no {LIBCUDA} in {where}; {FIX_NO_GPU}")
        return out
    if not facts.device_nodes:
        out.append(f"the NVIDIA driver's {LIBCUDA} is at {facts.libcuda} but no /dev/nvidia[0-9] device is "
                   f"present: no GPU was assigned to this container; {FIX_NO_GPU}")
    elif not facts.libcuda:
        out.append(f"{len(facts.device_nodes)} GPU device(s) ({', '.join(facts.device_nodes)}) but no {LIBCUDA} "
                   f"in {where}: the driver's libraries are not mounted or not on LD_LIBRARY_PATH "
                   "(on GKE they are in /usr/local/nvidia/lib64)")
    if facts.visible_devices is not None and facts.visible_devices.strip() in ("", "-1", "none", "void"):
        out.append(f"CUDA_VISIBLE_DEVICES={facts.visible_devices!r} hides every GPU from CUDA; unset it")
    n = facts.nvml.devices
    if n == 0:
        out.append("NVML reports 0 GPUs: the driver is loaded but this container was given no device; "
                   + FIX_NO_GPU)
    elif n is not None and n < expected_gpus:
        out.append(f"NVML reports {n} GPU(s), the role needs {expected_gpus} (gpusPerReplica): give the pod "
                   f"{expected_gpus} nvidia.com/gpu")
    if facts.driver is not None and facts.driver < tuple(min_driver):
        out.append(f"NVIDIA driver {facts.driver_text} (from {facts.driver_source}) is older than "
                   f"R{format_version(min_driver)}: the images' CUDA 13 wheels (torch, vLLM) need R580 or newer; "
                   "upgrade the node's driver (on GKE a node pool with gpu-driver-version=latest on a GKE "
                   "version that installs R580+)")
    return out


def check_gpu(expected_gpus: int, min_driver: tuple = MIN_DRIVER, *, facts: GPUFacts | None = None,
              **where) -> None:
    """Raise GPUPreflightError naming every cause when this container cannot run a role that needs
    `expected_gpus` GPUs on a driver at least `min_driver`. `where`: gather's injectable places."""
    facts = gather(**where) if facts is None else facts
    found = problems(facts, max(1, int(expected_gpus)), tuple(min_driver))
    if found:
        raise GPUPreflightError("GPU preflight failed: " + "; and ".join(found))
    if facts.driver is None:
        why = facts.nvml.error or "NVML not found"
        log.warning("GPU preflight: driver version unknown (%s; no %s); not checked", why, PROC_VERSION)
    else:
        log.info("GPU preflight: %s GPU device(s), driver %s (%s)", len(facts.device_nodes), facts.driver_text,
                 facts.driver_source)


def preflight_exit_code(accelerator: str, expected_gpus: int, role: str) -> int:
    """For entrypoints: 0 on accelerator cpu or when the GPUs check out; else the cause on stderr
    and EXIT_CODE. `if (rc := preflight_exit_code(...)): return rc`."""
    if accelerator == "cpu":
        return 0
    try:
        check_gpu(expected_gpus)
    except GPUPreflightError as exc:
        print(f"rlscale {role}: accelerator {accelerator}: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0
