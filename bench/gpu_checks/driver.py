"""The driver: cuInit through ctypes on libcuda.so.1 (what torch's first CUDA call does underneath), the
driver's CUDA version against the one torch was built for, and rlscale's GPU preflight verdict."""

from __future__ import annotations

import ctypes

from gpu_checks.common import row, short

CUDA_SUCCESS = 0


def cu_init(path: str | None) -> dict:
    """cuInit(0) on the driver library at `path` (None: the loader's libcuda.so.1): its return code and
    error name, the driver's CUDA version (cuDriverGetVersion, e.g. 13000 for 13.0) and the device count."""
    name = path or "libcuda.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        return {"library": name, "loaded": False, "rc": None, "error": f"cannot load {name}: {exc}"}
    rc = int(lib.cuInit(0))
    out = {"library": name, "loaded": True, "rc": rc, "error": None if rc == CUDA_SUCCESS else error_name(lib, rc)}
    version = ctypes.c_int(0)
    if int(lib.cuDriverGetVersion(ctypes.byref(version))) == CUDA_SUCCESS:
        out["driver_cuda"] = f"{version.value // 1000}.{version.value % 1000 // 10}"
    if rc == CUDA_SUCCESS:
        count = ctypes.c_int(0)
        if int(lib.cuDeviceGetCount(ctypes.byref(count))) == CUDA_SUCCESS:
            out["devices"] = count.value
    return out


def error_name(lib, rc: int) -> str:
    """CUDA's name for a driver return code (cuGetErrorName), e.g. CUDA_ERROR_NO_DEVICE."""
    text = ctypes.c_char_p()
    try:
        if int(lib.cuGetErrorName(rc, ctypes.byref(text))) == CUDA_SUCCESS and text.value:
            return text.value.decode()
    except AttributeError:  # a stub library without it
        pass
    return f"CUresult {rc}"


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    try:
        return tuple(int(p) for p in str(text).split(".")[:2]) if text else None
    except ValueError:
        return None


def driver_rows(facts_or_none, init: dict, torch_cuda: str | None) -> list[dict]:
    """The rows of the driver check: cuInit must return CUDA_SUCCESS, the driver's CUDA version must be at
    least torch's (a CUDA 13 torch on an R570 driver fails here), and the preflight must pass."""
    ok = init.get("rc") == CUDA_SUCCESS
    rows = [row("driver", "cuInit(0)", "CUresult", verdict="ok" if ok else "FAIL",
                note=f"{init['library']}: " + ("CUDA_SUCCESS" if ok else str(init.get("error")))
                + (f", {init['devices']} device(s)" if "devices" in init else ""))]
    have, need = version_tuple(init.get("driver_cuda")), version_tuple(torch_cuda)
    if have is None or need is None:
        rows.append(row("driver", "driver CUDA >= torch CUDA", "version", verdict="n/a",
                        note=f"driver CUDA {init.get('driver_cuda')}, torch built for CUDA {torch_cuda}"))
    else:
        rows.append(row("driver", "driver CUDA >= torch CUDA", "version", verdict="ok" if have >= need else "FAIL",
                        note=f"driver supports CUDA {init['driver_cuda']}, torch built for {torch_cuda}"
                        + ("" if have >= need else ": upgrade the driver (R580+ for CUDA 13)")))
    rows.append(preflight_row(facts_or_none))
    return rows


def preflight_row(facts) -> dict:
    try:
        from rlscale import gpu_preflight as gp
    except Exception as exc:  # the cuInit rows still stand
        return row("driver", "GPU preflight", "verdict", verdict="error", note=f"not run: {short(exc)}")
    facts = gp.gather() if facts is None else facts
    found = gp.problems(facts, 1)
    drv = f"driver {facts.driver_text} from {facts.driver_source}" if facts.driver_text else "driver version unknown"
    nvml = f"{facts.nvml.devices} device(s)" if facts.nvml.devices is not None else facts.nvml.error or "not found"
    detail = f"{len(facts.device_nodes)} /dev/nvidiaN, {drv}, NVML: {nvml}, libcuda {facts.libcuda}"
    return row("driver", "GPU preflight", "verdict", verdict="ok" if not found else "FAIL",
               note=detail if not found else "; ".join(found) + f" ({detail})")


def run(s, budget) -> list[dict]:
    import torch

    try:
        from rlscale import gpu_preflight as gp

        facts = gp.gather()
        path = facts.libcuda
    except Exception:  # the preflight row says why; cuInit goes through the loader's search
        facts, path = None, None
    return driver_rows(facts, cu_init(path), torch.version.cuda)
