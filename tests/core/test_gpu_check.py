"""bench/gpu_check.py (`make gpu-check`) on a machine without a GPU: the early exit that lists the checks, the
checks' code on the CPU (--cpu-smoke: IPC through shared memory, decode, rlscale's DeepSpeed learner on a tiny
model), the 2x gate and the failing exit, cuInit through ctypes against a stub libcuda, the NCCL verdicts,
and the planner's predictions the checks compare with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.py"
sys.path.insert(0, str(SCRIPT.parent))

import gpu_check  # noqa: E402  (bench/ is not a package)
from gpu_checks import common, decode, driver, handover, learner  # noqa: E402

HAS_GPU = any(n.startswith("nvidia") and n[6:].isdigit() for n in os.listdir("/dev"))


def _run(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, **(env or {})})


def _rows(folder: Path, check: str) -> list[dict]:
    return [r for r in json.loads((folder / "gpu-check.json").read_text())["rows"] if r["check"] == check]


@pytest.mark.slow  # seconds of subprocesses or models: `make test`, not `make unit`
@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_lists_the_checks_and_exits_0(tmp_path):
    proc = _run(env={"OUT": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "gpu-check: no GPU here" in proc.stdout and "nothing measured" in proc.stdout
    for check in common.CHECKS:
        assert f"  {check} " in proc.stdout, check
    assert list(tmp_path.iterdir()) == []  # no report pretending to be one


@pytest.mark.slow  # seconds of subprocesses or models: `make test`, not `make unit`
def test_cpu_smoke_hands_buckets_over_shared_memory_and_decodes(tmp_path):
    proc = _run("--cpu-smoke", "--checks", "driver,ipc,nccl,offload,decode", env={"OUT": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ipc = _rows(tmp_path, "ipc")
    first, steady, contents = ipc
    for r in (first, steady):
        assert r["metric"] == "GB/s" and r["measured"] > 0 and r["predicted"] > 0 and not r["gated"]
        assert r["ratio"] == pytest.approx(r["measured"] / r["predicted"])
        assert "shared memory" in r["item"]
    assert len(steady["seconds"]) == 3  # 4 buckets, the first apart
    assert contents["verdict"] == "ok" and "all 4 buckets" in contents["note"]
    dec = _rows(tmp_path, "decode")
    assert [r["concurrency"] for r in dec] == [1, 2]
    for r in dec:
        assert r["measured"] > 0 and r["predicted"] > 0 and r["roofline_tps"] >= r["predicted"]
    for check in ("driver", "nccl", "offload"):
        assert [r["verdict"] for r in _rows(tmp_path, check)] == ["needs a GPU"]
    md = (tmp_path / "gpu-check.md").read_text()
    assert "## ipc" in md and "| tiny b=1 | tokens/s |" in md and "**passed**" in md
    assert md in proc.stdout  # the same tables on stdout


@pytest.mark.slow
def test_cpu_smoke_trains_rlscales_deepspeed_learner_at_zero_1_and_3(tmp_path):
    proc = _run("--cpu-smoke", "--checks", "learner", env={"OUT": str(tmp_path)}, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = _rows(tmp_path, "learner")
    speed = [r for r in rows if r["metric"] == "tokens/s"]
    assert [r["item"] for r in speed] == ["ZeRO-1, checkpointing off", "ZeRO-1, checkpointing on",
                                         "ZeRO-3, checkpointing off", "ZeRO-3, checkpointing on"]
    for r in speed:
        assert r["verdict"] == "info", r
        assert r["measured"] > 0 and r["predicted"] > 0 and r["tokens"] == 4 * 16
        assert r["params"] > 0 and r["loss"] is not None
    assert speed[0]["params"] == speed[2]["params"]  # ZeRO-3's placeholders counted at full size


@pytest.mark.slow
def test_offload_states_on_the_cpu_and_the_zero_3_refusal():
    """DeepSpeed's offload_states / reload_states through the learner on the CPU (host to host: the calls, not
    the figures). At ZeRO-3 DeepSpeed refuses the optimizer's states unless it runs its FusedAdam; the
    learner runs torch's AdamW, so the check fails there and measures the partial offload."""
    planner, _ = common.import_planner()
    s = common.cpu_smoke_settings(["offload"])
    rows = learner.run(s, common.Budget(600), planner, planner.profiles.PROFILES["cpu"], learner=False, offload=True)
    by = {(r["item"], r["metric"]): r for r in rows}
    z1, z3 = "ZeRO-1, checkpointing off", "ZeRO-3, checkpointing off"
    assert by[(z1, "tokens/s")]["measured"] > 0 and by[(z3, "tokens/s")]["measured"] > 0
    for item in (z1, z3):
        assert by[(item, "trains after reload")]["verdict"] == "ok"
        assert by[(item, "offload s")]["measured"] > 0 and by[(item, "reload s")]["measured"] > 0
    assert (z1, "optimizer states offloaded") not in by
    refused = by[(z3, "optimizer states offloaded")]
    assert refused["verdict"] == "FAIL" and "FusedAdam" in refused["note"] and "lp_params" in refused["note"]


def test_the_gate_fails_a_miss_of_more_than_2x_either_way():
    assert common.row("x", "i", "m", 1.9, 1.0, gated=True)["verdict"] == "ok"
    assert common.row("x", "i", "m", 0.55, 1.0, gated=True)["verdict"] == "ok"
    assert common.row("x", "i", "m", 2.1, 1.0, gated=True)["verdict"] == "MISS"
    assert common.row("x", "i", "m", 0.45, 1.0, gated=True)["verdict"] == "MISS"
    assert common.row("x", "i", "m", 0.1, 1.0)["verdict"] == "info"  # not gated
    assert common.row("x", "i", "m", 1.0, None, gated=True)["verdict"] == "n/a"
    rows = [common.row("x", "a", "m", 3.0, 1.0, gated=True), common.row("x", "b", "m", verdict="FAIL"),
            common.row("x", "c", "m", verdict="needs a GPU"), common.row("x", "d", "m", verdict="skipped")]
    assert [r["item"] for r in common.failures(rows)] == ["a", "b"]


def test_a_miss_makes_the_run_exit_1_with_a_failed_line(tmp_path, monkeypatch, capsys):
    miss = common.row("learner", "ZeRO-1, checkpointing off", "peak GB", 70.0, 30.0, gated=True)
    monkeypatch.setattr(gpu_check, "run_checks", lambda *a: [miss, common.row("ipc", "x", "GB/s", 1.0, 1.0)])
    assert gpu_check.main(["--cpu-smoke", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert "gpu-check: FAILED: 1 row(s) missed or failed: learner ZeRO-1, checkpointing off peak GB: MISS" in out.err
    assert "| 70 | 30 | 2.33 | MISS (gated) |" in (tmp_path / "gpu-check.md").read_text()
    assert json.loads((tmp_path / "gpu-check.json").read_text())["rows"][0]["verdict"] == "MISS"


@pytest.mark.parametrize("rc,version", [(0, 12080), (100, 13000)])
def test_cuinit_through_ctypes_against_a_stub_libcuda(tmp_path, rc, version):
    src = tmp_path / "cuda.c"
    src.write_text(f"""
int cuInit(unsigned int flags) {{ return {rc}; }}
int cuDriverGetVersion(int *v) {{ *v = {version}; return 0; }}
int cuDeviceGetCount(int *n) {{ *n = 2; return 0; }}
int cuGetErrorName(int e, const char **s) {{ *s = e == 100 ? "CUDA_ERROR_NO_DEVICE" : "?"; return 0; }}
""")
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    init = driver.cu_init(str(lib))
    assert init["rc"] == rc and init["driver_cuda"] == f"{version // 1000}.{version % 1000 // 10}"
    rows = driver.driver_rows(None, init, "13.0")
    cu, ver = rows[0], rows[1]
    if rc == 0:
        assert cu["verdict"] == "ok" and "2 device(s)" in cu["note"]
        assert ver["verdict"] == "FAIL" and "driver supports CUDA 12.8, torch built for 13.0" in ver["note"]
    else:
        assert cu["verdict"] == "FAIL" and "CUDA_ERROR_NO_DEVICE" in cu["note"]
        assert ver["verdict"] == "ok"
    missing = driver.cu_init(str(tmp_path / "absent.so"))
    assert missing["rc"] is None and "cannot load" in missing["error"]
    assert driver.driver_rows(None, missing, "13.0")[0]["verdict"] == "FAIL"


def test_nccl_verdicts():
    dup = "DistBackendError: NCCL error ... Last error: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device"
    ok = handover.nccl_verdict([(0, "refused", dup), (1, "refused", dup)], 90)
    assert ok["verdict"] == "ok" and "why colocated placement hands weights over by CUDA IPC" in ok["note"]
    formed = handover.nccl_verdict([(0, "formed", "all_reduce on one GPU gave 2"), (1, "refused", dup)], 90)
    assert formed["verdict"] == "FAIL" and "premise" in formed["note"]
    hung = handover.nccl_verdict([(0, "refused", dup)], 90)
    assert hung["verdict"] == "FAIL" and "hung" in hung["note"]
    other = handover.nccl_verdict([(0, "refused", "RuntimeError: no NCCL"), (1, "refused", "RuntimeError: no NCCL")], 9)
    assert other["verdict"] == "FAIL" and "proves nothing" in other["note"]


@pytest.mark.slow  # seconds of subprocesses or models: `make test`, not `make unit`
def test_the_nccl_check_runs_two_ranks_and_without_a_gpu_proves_nothing():
    # the two processes, their answers and the verdict; here both fail before NCCL (no CUDA device)
    s = common.cpu_smoke_settings(["nccl"])
    s.nccl_timeout_s = 20
    (r,) = handover.run_nccl(s, common.Budget(600))
    assert r["verdict"] == "FAIL" and "refused, but not for a duplicate GPU" in r["note"], r
    assert r["note"].count("|") == 1  # both ranks answered


def test_roofline_and_planner_decode_for_7b_on_h200():
    planner, note = common.import_planner()
    assert planner is not None, note
    shape = common.planner_shape(planner, "qwen2.5-7b")
    assert 7.5e9 < shape.params < 7.7e9  # published: 7,615,616,512
    h200 = planner.profiles.PROFILES["H200"]
    roof1, plan1 = decode.predictions(planner, shape, h200, "bfloat16", 1, 100)
    # b=1 reads the 15 GB of weights once per token: ~300 tokens/s at 4.8 TB/s
    assert 250 < roof1 < 350 and plan1 < roof1
    roof256, plan256 = decode.predictions(planner, shape, h200, "bfloat16", 256, 100)
    assert roof256 > 100 * roof1 and plan256 > 50 * plan1  # memory-bound: batching is nearly free
    r = decode.decode_row("qwen2.5-7b", 1, {"step_ms": 1.0, "tokens_per_s": 1000.0, "context": 80, "peak_gb": 16.0},
                          roof1, plan1)
    assert r["verdict"] == "FAIL" and "faster than the roofline" in r["note"]


def test_learner_predictions_come_from_the_planners_model():
    planner, note = common.import_planner()
    assert planner is not None, note
    s = gpu_check.settings(gpu_check.parse_args([]), "NVIDIA H100 80GB HBM3")
    assert s.profile == "H100" and s.gated and s.concurrency == [1, 8, 64, 256]
    h100 = planner.profiles.PROFILES["H100"]
    off = learner.predictions(s, planner, h100, {"zero_stage": 1, "gc": False})
    on = learner.predictions(s, planner, h100, {"zero_stage": 1, "gc": True})
    # the fp32 log-softmax rows stay with checkpointing on: less than half, not a tenth
    assert on["activations"] < off["activations"] / 2 and on["tokens_per_s"] < off["tokens_per_s"]
    assert off["peak"] == pytest.approx(off["state"] + off["activations"])
    params = common.planner_shape(planner, "qwen2.5-1.5b").params
    assert 1.5e9 < params < 1.6e9 and off["grads"] == 2 * params  # bf16 gradients
    # the offload prediction is the planner's host copy of the resident states
    assert off["host_copy_s"] == pytest.approx(off["resident"] / h100.host_bandwidth)
    assert not off["dropped"]


def test_learner_rows_gate_the_planner_and_call_an_unplanned_oom_a_miss():
    planner, _ = common.import_planner()
    s = gpu_check.settings(gpu_check.parse_args([]), "NVIDIA H200")
    cfg = {"zero_stage": 3, "gc": True}
    p = learner.predictions(s, planner, planner.profiles.PROFILES["H200"], cfg)
    tokens = s.learner_samples * (s.learner_prompt + s.learner_response)
    m = {"step_s": [tokens / p["tokens_per_s"] * 1.5], "warmup_s": 2.0, "tokens": tokens, "params": 1.54e9,
         "resident_bytes": p["resident"] * 1.1, "peak_bytes": p["resident"] * 1.1 + p["grads"] + 3 * p["activations"]}
    rows = {r["metric"]: r for r in learner.learner_rows(s, cfg, m, p)}
    assert rows["tokens/s"]["verdict"] == "ok" and rows["tokens/s"]["ratio"] == pytest.approx(1 / 1.5)
    assert rows["activation GB"]["verdict"] == "MISS" and rows["activation GB"]["ratio"] == pytest.approx(3.0)
    assert rows["resident GB"]["verdict"] == "ok"
    oom = learner.learner_rows(s, cfg, {"error": "CUDA out of memory", "oom": True, "device_total": 141e9}, p)
    assert oom[0]["verdict"] == "MISS" and "the planner said it fits" in oom[0]["note"]


@pytest.mark.slow  # seconds of subprocesses or models: `make test`, not `make unit`
def test_without_deepspeed_a_plain_torch_step_stands_in(monkeypatch):
    planner, _ = common.import_planner()
    s = common.cpu_smoke_settings(["learner"])
    rows = learner.plain_rows(s, planner, planner.profiles.PROFILES["cpu"], "ModuleNotFoundError: deepspeed")
    speed = [r for r in rows if r["metric"] == "tokens/s"]
    assert [r["item"] for r in speed] == ["ZeRO-0, checkpointing off", "ZeRO-0, checkpointing on"]
    for r in speed:
        assert r["measured"] > 0 and r["predicted"] > 0 and r["tokens"] == 2 * 16
        assert "DeepSpeed learner not importable (ModuleNotFoundError: deepspeed)" in r["note"]


def test_planner_loads_under_a_stub_when_the_package_init_cannot_import():
    # rlscale.plan's __init__ imports the whole planner; the modules the checks need are stdlib-only
    code = ("import sys; sys.modules['rlscale.plan.decision'] = None; sys.path.insert(0, 'bench'); "
            "from gpu_checks import common; p, note = common.import_planner(); "
            "print('OK', p.throughput.decode_step_seconds(1, 1e9, 0, 0, 1e9, 1e12, 1e6) > 0, "
            "p.placement.handover_seconds(1e9, 1e12) > 0, note)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("OK True True") and "without its package" in proc.stdout


def test_bad_check_names_are_refused_naming_the_choices(capsys):
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--checks", "ipc,nvlink"])
    err = capsys.readouterr().err
    assert "--checks: nvlink unknown; use some of driver, ipc, nccl, learner, offload, decode" in err
