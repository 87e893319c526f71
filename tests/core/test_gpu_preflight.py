"""GPU fail-fast (rlscale.gpu_preflight) against fake /dev, /proc and library directories."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlscale import gpu_preflight as gp

PROC_580 = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
            "(dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:51:21 UTC 2025\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
PROC_535 = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")


def _node(tmp_path, gpus: int = 1, proc: str | None = PROC_580, libs: tuple[str, ...] = ("libcuda.so.1",),
          lib_dir: str = "usr/local/nvidia/lib64") -> dict:
    """A fake machine: /dev with `gpus` device files (plus the control nodes), the /proc file, the libraries."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ["nvidiactl", "nvidia-uvm", *(f"nvidia{i}" for i in range(gpus))] if gpus else []:
        (dev / name).write_text("")
    procf = tmp_path / "version"
    if proc is not None:
        procf.write_text(proc)
    libs_at = tmp_path / lib_dir
    libs_at.mkdir(parents=True)
    for lib in libs:
        (libs_at / lib).write_text("")
    return dict(dev_dir=dev, proc_version=procf, lib_dirs=[str(tmp_path / "usr/lib"), str(libs_at)], env={},
                ldconfig=None)  # not this machine's loader cache


def test_parse_proc_version_both_kernel_module_flavours():
    assert gp.parse_proc_version(PROC_580) == "580.95.05"
    assert gp.parse_proc_version(PROC_535) == "535.104.05"
    assert gp.parse_proc_version("GCC version: 12\n") is None
    assert gp.parse_version("580.95.05") == (580, 95, 5)
    assert gp.parse_version("580.95.05") >= gp.MIN_DRIVER > gp.parse_version("575.57.08")
    assert gp.parse_version("R580") is None


def test_device_nodes_are_the_numbered_ones_in_order(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    for n in ("nvidia10", "nvidia2", "nvidiactl", "nvidia-uvm", "nvidia-caps", "nvidia0"):
        (dev / n).write_text("")
    assert [os.path.basename(p) for p in gp.device_nodes(dev)] == ["nvidia0", "nvidia2", "nvidia10"]
    assert gp.device_nodes(tmp_path / "missing") == []


def test_library_dirs_put_ld_library_path_first_and_include_gkes():
    dirs = gp.library_dirs({"LD_LIBRARY_PATH": "/opt/a::/usr/local/nvidia/lib64"})
    assert dirs[0] == "/opt/a"
    assert dirs.count("/usr/local/nvidia/lib64") == 1
    assert "/usr/local/nvidia/lib64" in gp.library_dirs({})


def test_a_good_node_passes_and_reads_the_driver_from_proc(tmp_path):
    where = _node(tmp_path, gpus=2)
    facts = gp.gather(**where)
    assert facts.driver == (580, 95, 5) and facts.driver_source.endswith("version")
    assert facts.libcuda.endswith("usr/local/nvidia/lib64/libcuda.so.1")  # found in GKE's directory
    gp.check_gpu(2, **where)


def test_no_gpu_at_all_names_the_pod_and_runtime_fix(tmp_path):
    where = _node(tmp_path, gpus=0, proc=None, libs=())
    with pytest.raises(gp.GPUPreflightError) as e:
        gp.check_gpu(1, **where)
    msg = str(e.value)
    assert "no GPU is visible" in msg and "nvidia.com/gpu" in msg and "/usr/local/nvidia/lib64" in msg
    assert e.value.exit_code == 2


def test_devices_without_driver_libraries_say_ld_library_path(tmp_path):
    where = _node(tmp_path, gpus=1, libs=())
    with pytest.raises(gp.GPUPreflightError, match="no libcuda.so.1 .*LD_LIBRARY_PATH"):
        gp.check_gpu(1, **where)


def test_libraries_without_devices_say_no_gpu_assigned(tmp_path):
    where = _node(tmp_path, gpus=0)
    with pytest.raises(gp.GPUPreflightError, match="no GPU was assigned"):
        gp.check_gpu(1, **where)


def test_old_driver_names_r580_and_the_version_found(tmp_path):
    where = _node(tmp_path, proc=PROC_535)
    with pytest.raises(gp.GPUPreflightError) as e:
        gp.check_gpu(1, **where)
    msg = str(e.value)
    assert "535.104.05" in msg and "R580" in msg and "CUDA 13" in msg
    gp.check_gpu(1, min_driver=(535,), **where)  # the threshold is a parameter


def test_nvml_is_preferred_and_its_device_count_is_checked(tmp_path):
    where = _node(tmp_path, gpus=2, proc=PROC_535, libs=("libcuda.so.1", "libnvidia-ml.so.1"))
    asked = []

    def nvml(path, devices=2):
        asked.append(path)
        return gp.NvmlInfo(driver="580.65.06", devices=devices)

    facts = gp.gather(**where, nvml=nvml)
    assert asked and asked[0].endswith("libnvidia-ml.so.1")
    assert facts.driver == (580, 65, 6) and facts.driver_source == "NVML"  # not the /proc file's 535
    gp.check_gpu(2, facts=facts)
    with pytest.raises(gp.GPUPreflightError, match="NVML reports 2 GPU.*needs 4"):
        gp.check_gpu(4, facts=facts)
    zero = gp.gather(**where, nvml=lambda p: nvml(p, devices=0))
    with pytest.raises(gp.GPUPreflightError, match="NVML reports 0 GPUs"):
        gp.check_gpu(1, facts=zero)


def test_nvml_failure_falls_back_to_proc(tmp_path):
    where = _node(tmp_path, proc=PROC_535, libs=("libcuda.so.1", "libnvidia-ml.so.1"))
    facts = gp.gather(**where, nvml=lambda p: gp.NvmlInfo(error="nvmlInit_v2 returned 9 (Driver Not Loaded)"))
    assert facts.driver == (535, 104, 5)
    with pytest.raises(gp.GPUPreflightError, match="535.104.05"):
        gp.check_gpu(1, facts=facts)


def test_unknown_driver_version_is_not_an_error(tmp_path, caplog):
    where = _node(tmp_path, proc=None)
    with caplog.at_level("WARNING"):
        gp.check_gpu(1, **where)
    assert "driver version unknown" in caplog.text


def test_cuda_visible_devices_hiding_everything_is_named(tmp_path):
    where = _node(tmp_path)
    where["env"] = {"CUDA_VISIBLE_DEVICES": ""}
    with pytest.raises(gp.GPUPreflightError, match="CUDA_VISIBLE_DEVICES"):
        gp.check_gpu(1, **where)


def test_several_causes_are_all_reported(tmp_path):
    where = _node(tmp_path, gpus=1, proc=PROC_535, libs=())
    with pytest.raises(gp.GPUPreflightError) as e:
        gp.check_gpu(1, **where)
    assert "no libcuda.so.1" in str(e.value) and "535.104.05" in str(e.value)


def test_the_loader_cache_finds_libraries_outside_the_directories(tmp_path):
    where = {**_node(tmp_path, libs=()), "ldconfig": lambda name: name if name == "libcuda.so.1" else None}
    facts = gp.gather(**where)
    assert facts.libcuda == "libcuda.so.1" and facts.libnvml is None
    gp.check_gpu(1, facts=facts)
    assert gp.ldconfig_lookup("libnot-a-driver.so.1") is None


def test_real_nvml_query_on_a_missing_library_says_why():
    info = gp.query_nvml("/nonexistent/libnvidia-ml.so.1")
    assert info.driver is None and "cannot load" in info.error


def test_preflight_exit_code_skips_cpu(capsys):
    assert gp.preflight_exit_code("cpu", 8, "learner") == 0
    assert capsys.readouterr().err == ""


def test_core_module_imports_no_torch():
    code = "import sys, rlscale.gpu_preflight; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


@pytest.mark.skipif(any(n.startswith("nvidia") and n[6:].isdigit() for n in os.listdir("/dev")),
                    reason="this machine has a GPU")
def test_rollout_entrypoint_exits_2_on_a_gpu_run_without_a_gpu(tmp_path):
    from rlscale.runconfig import RunConfig

    config = RunConfig(run="t", spec={"model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
                                      "hardware": {"accelerator": "H200"}},
                       ray_address="127.0.0.1:1").save(tmp_path / "run.json")
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "rlscale.rollout.entrypoint", "--config", str(config)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "rlscale rollout: accelerator H200: GPU preflight failed" in proc.stderr
    assert "no GPU is visible" in proc.stderr or "no GPU was assigned" in proc.stderr  # a host with a driver
