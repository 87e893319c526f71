"""The engine's vLLM arguments (tensor parallelism, memory share, sleep mode), its sleep/wake
contract, and one tensor-parallel engine of vLLM's CPU build, in its own process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlscale.rollout.engine import EngineConfig, RolloutEngine, engine_kwargs


def test_one_gpu_runs_its_worker_in_process_with_the_configured_memory_share():
    kw = engine_kwargs(EngineConfig(model="m", gpu_memory_utilization=0.62), on_gpu=True)
    assert kw["distributed_executor_backend"] == "uni"
    assert "tensor_parallel_size" not in kw
    assert kw["gpu_memory_utilization"] == pytest.approx(0.62)
    assert "kv_cache_memory_bytes" not in kw
    assert kw["enforce_eager"] is False  # CUDA graphs on GPU
    assert "enable_sleep_mode" not in kw


def test_default_memory_share_is_the_planners_not_half():
    # The planner sizes KV caches with 90% of each GPU; the engine used to take 50% silently.
    kw = engine_kwargs(EngineConfig(model="m"), on_gpu=True)
    assert kw["gpu_memory_utilization"] == pytest.approx(0.9)


def test_tensor_parallel_uses_the_multiprocessing_executor():
    kw = engine_kwargs(EngineConfig(model="m", tensor_parallel_size=4), on_gpu=True)
    assert kw["tensor_parallel_size"] == 4
    assert kw["distributed_executor_backend"] == "mp"
    # also when the engine core itself is in-process (the default)
    kw = engine_kwargs(EngineConfig(model="m", tensor_parallel_size=2, multiprocess=True), on_gpu=True)
    assert kw["distributed_executor_backend"] == "mp"


def test_multiprocess_single_gpu_keeps_vllms_default_executor():
    kw = engine_kwargs(EngineConfig(model="m", multiprocess=True), on_gpu=True)
    assert "distributed_executor_backend" not in kw


def test_sleep_mode_reaches_vllm_on_gpu_only():
    cfg = EngineConfig(model="m", enable_sleep_mode=True, kv_cache_bytes=3 * 2**20)
    assert engine_kwargs(cfg, on_gpu=True)["enable_sleep_mode"] is True
    cpu = engine_kwargs(cfg, on_gpu=False)
    # vLLM's CPU platform has no sleep mode: the argument stays out, the KV cache is sized in bytes
    assert "enable_sleep_mode" not in cpu and "gpu_memory_utilization" not in cpu
    assert cpu["kv_cache_memory_bytes"] == 3 * 2**20
    assert cpu["enforce_eager"] is True


def test_bad_tensor_parallel_size_is_refused_and_extra_overrides():
    with pytest.raises(ValueError, match="tensor_parallel_size 0"):
        engine_kwargs(EngineConfig(model="m", tensor_parallel_size=0), on_gpu=True)
    kw = engine_kwargs(EngineConfig(model="m", block_size=32, extra={"enable_prefix_caching": False}), on_gpu=False)
    assert kw["block_size"] == 32 and kw["enable_prefix_caching"] is False


def test_engine_config_round_trips_the_new_fields():
    cfg = EngineConfig.from_dict({"model": "m", "tensor_parallel_size": 2, "enable_sleep_mode": True})
    assert (cfg.tensor_parallel_size, cfg.enable_sleep_mode) == (2, True)
    with pytest.raises(ValueError, match="unknown fields"):
        EngineConfig.from_dict({"model": "m", "tp": 2})


def _run_config(plan=None, **spec):
    from rlscale.runconfig import RunConfig
    from rlscale.spec import parse_spec

    base = {"model": {"path": "Qwen/Qwen2.5-7B-Instruct"}, "hardware": {"accelerator": "H200"}}
    return RunConfig(run="r", spec=parse_spec({**base, **spec}), plan=plan, model_dir="/models/q", seed=3)


def test_run_engine_takes_tp_and_memory_share_from_the_spec():
    from rlscale.trainer.run_env import rollout_engine_config

    cfg = _run_config(rollout={"gpusPerReplica": 4, "gpuMemoryUtilization": 0.7},
                      plan=SimpleNamespace(placement="disaggregated", rollout_memory_utilization=0.85))
    e = rollout_engine_config(cfg)
    assert (e.model, e.dtype, e.seed) == ("/models/q", "bfloat16", 3)
    assert e.tensor_parallel_size == 4
    assert e.gpu_memory_utilization == pytest.approx(0.7)  # the spec's word beats the plan's
    assert e.enable_sleep_mode is False
    kw = engine_kwargs(e, on_gpu=True)
    assert kw["tensor_parallel_size"] == 4 and kw["distributed_executor_backend"] == "mp"


def test_run_engine_memory_share_from_the_plan_else_the_planners_default():
    from rlscale.trainer.run_env import rollout_engine_config

    colocated = SimpleNamespace(placement="colocated", rollout_memory_utilization=0.45)
    e = rollout_engine_config(_run_config(plan=colocated))
    assert e.gpu_memory_utilization == pytest.approx(0.45)
    assert e.enable_sleep_mode is True and e.tensor_parallel_size == 1
    # a plan from before these fields: 0.9, and the spec's explicit placement
    e = rollout_engine_config(_run_config(plan=SimpleNamespace(), placement="colocated"))
    assert e.gpu_memory_utilization == pytest.approx(0.9) and e.enable_sleep_mode is True
    assert rollout_engine_config(_run_config()).enable_sleep_mode is False  # auto without a plan


def test_run_engine_on_cpu_ignores_gpus_per_replica():
    from rlscale.trainer.run_env import rollout_engine_config

    cfg = _run_config(hardware={"accelerator": "cpu"}, rollout={"gpusPerReplica": 2},
                      plan=SimpleNamespace(placement="colocated", rollout_memory_utilization=0.4))
    e = rollout_engine_config(cfg)
    assert e.tensor_parallel_size == 1 and e.enable_sleep_mode is False
    kw = engine_kwargs(e, on_gpu=False)
    assert kw["distributed_executor_backend"] == "uni" and "gpu_memory_utilization" not in kw


class FakeLLM:
    def __init__(self):
        self.calls: list[str] = []

    def sleep(self, level: int = 1):
        self.calls.append(f"sleep{level}")

    def wake_up(self, tags=None):
        self.calls.append("wake" + ("" if tags is None else ":" + ",".join(tags)))
        return True


def _bare_engine(on_gpu: bool, sleep_mode: bool) -> RolloutEngine:
    """A RolloutEngine around a fake LLM (no vLLM start), to test the sleep/wake contract."""
    import threading

    eng = RolloutEngine.__new__(RolloutEngine)
    eng.config = EngineConfig(model="m", enable_sleep_mode=sleep_mode)
    eng.llm, eng.on_gpu, eng.asleep, eng._lock, eng.version = FakeLLM(), on_gpu, False, threading.Lock(), 0
    eng._woken, eng._updating, eng.slept_level = set(), False, 0
    return eng


def test_sleep_and_wake_call_vllm_level_1_once_on_gpu():
    eng = _bare_engine(on_gpu=True, sleep_mode=True)
    assert eng.wake_up() is False  # awake already: nothing to do
    assert eng.sleep() is True and eng.sleep() is True
    assert eng.asleep
    with pytest.raises(RuntimeError, match="wake_up"):
        eng.generate([[1, 2]])
    with pytest.raises(RuntimeError, match="asleep"):
        eng.load_weights({}, version=1)
    assert eng.wake_up() is True and not eng.asleep
    assert eng.llm.calls == ["sleep1", "wake"]


def test_level_2_wakes_the_weights_for_an_update_before_the_kv_cache():
    eng = _bare_engine(on_gpu=True, sleep_mode=True)
    assert eng.sleep(level=2) is True and eng.slept_level == 2
    with pytest.raises(RuntimeError, match="wake_up"):
        eng.begin_update()  # the weights sleep: an update has nowhere to land
    assert eng.wake_up(["weights"]) is True and eng.asleep  # the KV cache still sleeps
    with pytest.raises(RuntimeError, match="wake_up"):
        eng.generate([[1, 2]])
    eng.begin_update()
    eng.abort_update()  # a broken update: no request may use the weights
    assert eng.version == -1 and not eng._lock.locked()
    assert eng.wake_up(["kv_cache"]) is True and not eng.asleep
    assert eng.llm.calls == ["sleep2", "wake:weights", "wake:kv_cache"]


@pytest.mark.parametrize("on_gpu,sleep_mode", [(False, True), (True, False), (False, False)])
def test_sleep_is_a_no_op_on_cpu_or_without_sleep_mode(on_gpu, sleep_mode):
    eng = _bare_engine(on_gpu, sleep_mode)
    assert eng.sleep() is False and eng.wake_up() is False
    assert not eng.asleep and eng.llm.calls == []


@pytest.mark.slow
def test_tensor_parallel_2_on_vllm_cpu_generates_and_updates_like_transformers(model_dirs):
    # Its own process: vLLM caches its environment per process, and the mp executor's workers.
    proc = subprocess.run([sys.executable, __file__, *model_dirs], capture_output=True, text=True, timeout=600)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    r = json.loads(lines[-1][len("RESULT "):])
    assert r["tp"] == 2
    assert r["before"] == r["expected_before"]
    assert r["after"] != r["before"]
    assert r["after"] == r["expected_after"] and r["version"] == 2
    assert r["logprob_error"] < 1e-4
    assert r["slept"] is False and r["woke"] is False  # no sleep mode on CPU
    # The second update came through a gloo group of the trainer and both TP workers, each its own rank: each
    # received every bucket along the chain (worker 0 forwarded them to worker 1) and loaded its own shard.
    assert r["received"] == r["sent"] > 0 and r["forwarded"] == r["sent"]
    assert r["after_gloo"] == r["expected_before"] and r["gloo_version"] == 3


def _tp_check(old_dir: str, new_dir: str) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import KV_CACHE_BYTES, decisive_state_dict, hf_greedy, hf_model, max_logprob_error

    from rlscale.rollout.transfer.control import ReplicaCommands
    from rlscale.trainer.transfer.gloo_trainer import GlooTrainerInitInfo, GlooTrainerWeightTransferEngine
    from rlscale.trainer.transfer.sources import TensorsSource

    engine = RolloutEngine(EngineConfig(model=old_dir, kv_cache_bytes=KV_CACHE_BYTES, tensor_parallel_size=2,
                                        enable_sleep_mode=True, transfer_backend="gloo"))
    prompt = [1] + [4 + (i * 7) % 13 for i in range(engine.block_size + 20)]
    old, new = decisive_state_dict(old_dir, seed=0), decisive_state_dict(new_dir, seed=1)
    engine.load_weights(old, version=1)
    before = engine.generate([prompt], temperature=0.0, max_new_tokens=16)[0][0]
    slept, woke = engine.sleep(), engine.wake_up()
    engine.load_weights(new, version=2)
    after = engine.generate([prompt], temperature=0.0, max_new_tokens=16)[0][0]
    # vLLM's protocol from this process: the replica's side of each phase is what a Serve replica runs.
    replica = ReplicaCommands(None, "tp2", engine)

    class Client:
        version = 3
        init_weight_transfer_engine = staticmethod(lambda info: replica.run("init", info))
        start_weight_update = staticmethod(lambda: replica.run("start", None))
        update_weights = staticmethod(lambda info: replica.run("update", info))

        def finish_weight_update(self, weight_version=None):
            self.stats = replica.run("finish", {"version": self.version})

    client = Client()
    trainer = GlooTrainerWeightTransferEngine.trainer_init(
        GlooTrainerInitInfo(rank=0, world_size=3, bucket_bytes=64 * 1024, timeout_s=120), client=client,
        source=TensorsSource(old))
    trainer.send_weights()
    after_gloo = engine.generate([prompt], temperature=0.0, max_new_tokens=16)[0][0]
    model = hf_model(new, new_dir)
    print("RESULT " + json.dumps({
        "tp": engine.llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size,
        "before": before.token_ids, "expected_before": hf_greedy(hf_model(old, old_dir), prompt, 16, 2),
        "after": after.token_ids, "expected_after": hf_greedy(model, prompt, 16, 2), "version": after.weights_version,
        "logprob_error": max_logprob_error(model, prompt, after), "slept": slept, "woke": woke,
        "after_gloo": after_gloo.token_ids, "gloo_version": after_gloo.weights_version, "sent": trainer.last.bytes,
        "received": client.stats["received"], "forwarded": client.stats["forwarded"],
    }), flush=True)
    engine.close()


if __name__ == "__main__":
    _tp_check(sys.argv[1], sys.argv[2])
