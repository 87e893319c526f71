"""vLLM engine wrapper: versioned generation with logprobs and in-place weight loading."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The engine must live in the calling process: start-up and weight updates are far faster there
# (docs/measurements.md, "vLLM on CPU"). These
# must be set before vLLM reads its environment, i.e. before the first vllm import.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# No precompiled header for inductor's CPU kernels. torch keeps a .gch it once wrote whatever
# is in it: on this 2-core machine one came out 131 MB instead of 155 MB (twice, for one venv)
# and every kernel compiled with it then failed ("'at::vec' has not been declared"), so vLLM
# never started from that venv again until the file was deleted. Headers parsed per kernel cost
# a few seconds per new kernel, once: compiled kernels are cached.
os.environ.setdefault("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "0")
# The CPU's vector ISA from /proc/cpuinfo, without inductor's probe: the probe compiles and loads
# a test library in every new process, and a probe that fails (a compile killed or timed out on
# a loaded machine) turns vectorisation off silently for that one process, whose kernels then
# differ from those the other processes compiled and cached.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# raw_logprobs: log-softmax of the model's logits before temperature, top-p or any
# logits processor, in float32. That is exactly what the learner recomputes
# (log_softmax of the forward pass at temperature 1), so the importance ratio
# pi_new / pi_old starts at 1 on-policy. processed_logprobs would return the
# temperature-scaled, nucleus-renormalised distribution the token was drawn from,
# which is not the policy the loss differentiates.
LOGPROBS_MODE = "raw_logprobs"


@dataclass(frozen=True)
class Sample:
    """One generated completion and the policy that produced it."""

    token_ids: list[int]
    logprobs: list[float]  # float32 log pi(token | prefix) of each sampled token
    finish_reason: str  # "stop" (EOS / stop token) or "length"
    weights_version: int


@dataclass
class EngineConfig:
    """How to build one vLLM engine; the defaults suit the 2-core CPU machines."""

    model: str
    dtype: str = "float32"
    max_model_len: int | None = None  # None: the model config's max positions
    max_num_seqs: int = 256
    seed: int = 0
    # CPU: bytes of KV cache (vLLM's VLLM_CPU_KVCACHE_SPACE only takes whole GiB).
    kv_cache_bytes: int = 512 * 2**20
    # GPU: fraction of device memory vLLM may take (weights + KV cache). 0.9 is what the planner
    # assumes (AcceleratorProfile.memory_utilization); trainer/run_env.py sets it from the spec or plan.
    gpu_memory_utilization: float = 0.9
    # GPUs of this one engine as vLLM tensor parallelism (rollout.gpusPerReplica); runs keep 1 on CPU.
    tensor_parallel_size: int = 1
    # GPU, colocated placement: let sleep()/wake_up() free the GPU for the learner between generations.
    enable_sleep_mode: bool = False
    # CPU: compute threads of this engine, unbound: vLLM's default (one bound thread per core, every
    # kernel waiting for all) decoded 60x slower on shared cores (docs/measurements.md, "vLLM on CPU").
    # None keeps vLLM's binding (a dedicated CPU node).
    cpu_threads: int | None = 1
    block_size: int | None = None  # None: vLLM's default for the platform
    # None: eager on CPU (start-up matters more than torch.compile there), CUDA graphs
    # and compilation on GPU (decode throughput at small batches depends on them).
    enforce_eager: bool | None = None
    multiprocess: bool = False  # True: vLLM's default engine process
    # vLLM's weight transfer backend the driver publishes through (rlscale.rollout.transfer): nccl or ipc on
    # GPUs, rlscale's gloo or shm stand-ins on CPU; None: no transfer engine (load_weights only).
    transfer_backend: str | None = None
    # spec.lora: {"rank": r, "alpha": a}; the engine serves the base with vLLM's LoRA and each weight update is
    # an adapter (rlscale.rollout.lora). None: updates replace the weights.
    lora: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # more LLM(...) arguments

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EngineConfig:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"engine config: unknown fields {sorted(unknown)}; known: {sorted(known)}")
        return cls(**dict(d))


def eos_token_ids(model_dir: str | os.PathLike) -> list[int]:
    """EOS ids from the HF config files: the engine runs without a tokenizer."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        p = Path(model_dir) / name
        if p.is_file():
            v = json.loads(p.read_text()).get("eos_token_id")
            if isinstance(v, int):
                ids.add(v)
            elif isinstance(v, list):
                ids.update(int(x) for x in v)
    return sorted(ids)


def _use_cpu_threads(n: int) -> None:
    import torch

    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    # vLLM keeps the process's thread count when OMP_NUM_THREADS is set; the variable
    # also reaches the engine process when it is a separate one.
    os.environ["OMP_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)


def _on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def engine_kwargs(config: EngineConfig, on_gpu: bool) -> dict[str, Any]:
    """The `vllm.LLM(...)` arguments of `config` on a GPU or on the CPU (pure: tested without vLLM).

    Tensor parallelism (tensor_parallel_size > 1) runs one worker process per shard: vLLM's
    multiprocessing executor `mp`; one shard keeps the worker in this process (`uni`). Runs set it on
    GPUs only (rollout.gpusPerReplica); vLLM's CPU build runs it too (tests/rollout/test_engine_args.py)."""
    tp = int(config.tensor_parallel_size)
    if tp < 1:
        raise ValueError(f"engine config: tensor_parallel_size {tp}; use 1 or more")
    kwargs: dict[str, Any] = dict(
        model=config.model,
        dtype=config.dtype,
        max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs,
        seed=config.seed,
        enforce_eager=(not on_gpu) if config.enforce_eager is None else config.enforce_eager,
        # We speak token ids only: no tokenizer load, no detokenisation cost.
        skip_tokenizer_init=True,
        logprobs_mode=LOGPROBS_MODE,
        enable_prefix_caching=True,
        worker_extension_cls="rlscale.rollout.worker_ext.RolloutWorkerExtension",
    )
    if tp > 1:
        kwargs["tensor_parallel_size"] = tp
        kwargs["distributed_executor_backend"] = "mp"
    elif not config.multiprocess:
        kwargs["distributed_executor_backend"] = "uni"
    if on_gpu:
        kwargs["gpu_memory_utilization"] = float(config.gpu_memory_utilization)
        if config.enable_sleep_mode:
            # vLLM's CPU platform refuses enable_sleep_mode; on CPU sleep()/wake_up() are no-ops.
            kwargs["enable_sleep_mode"] = True
    else:
        kwargs["kv_cache_memory_bytes"] = config.kv_cache_bytes
    if config.block_size is not None:
        kwargs["block_size"] = config.block_size
    if config.lora:
        # One adapter served at a time: an update removes the old version's before it adds the new one.
        kwargs.update(enable_lora=True, max_lora_rank=int(config.lora["rank"]), max_loras=1)
    if config.transfer_backend:
        from vllm.config.weight_transfer import WeightTransferConfig

        kwargs["weight_transfer_config"] = WeightTransferConfig(backend=config.transfer_backend)
    kwargs.update(config.extra)
    return kwargs


class RolloutEngine:
    """One in-process vLLM `LLM` plus the weights version it currently holds."""

    adapter: Any = None  # spec.lora: the adapter served (rlscale.rollout.lora.AdapterSlot); None: plain weights

    def __init__(
        self, config: EngineConfig | Mapping[str, Any], version: int = 0, warmup: bool = True
    ):
        if not isinstance(config, EngineConfig):
            config = EngineConfig.from_dict(config)
        self.config = config
        self.version = version
        self.stop_token_ids = eos_token_ids(config.model)
        # LLM is not thread-safe; a Serve replica may call from several threads.
        self._lock = threading.Lock()
        # vLLM caches its environment once an engine has started in this process, so
        # one process cannot mix in-process and multiprocess engines.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if config.multiprocess else "0"
        from vllm import LLM

        from rlscale.rollout.transfer import register

        register()  # an in-process worker builds its transfer engine from vLLM's factory in LLM(...)
        on_gpu = _on_gpu()
        if not on_gpu and config.cpu_threads is not None:
            _use_cpu_threads(config.cpu_threads)
        self.llm = LLM(**engine_kwargs(config, on_gpu))
        self.on_gpu = on_gpu
        self.asleep = False
        self.slept_level = 0
        self._woken: set[str] = set()  # tags woken so far while asleep (a staged wake)
        self._updating = False
        self.block_size = int(self.llm.llm_engine.vllm_config.cache_config.block_size)
        self.last_update: dict[str, Any] = {}  # the latest load_weights: path and timings
        if config.lora:
            from rlscale.rollout.lora import AdapterSlot

            root = tempfile.mkdtemp(prefix="rlscale-lora-")
            self.adapter = AdapterSlot(root, config.lora.get("alpha"))
            # The adapters' folder goes with the engine (close(), or when it is collected); before, each
            # engine left one in the temp dir (16 under /tmp after a day of test runs here).
            self._adapter_dir = weakref.finalize(self, shutil.rmtree, root, True)
        if warmup:
            # The first call with logprobs pays a one-time cost (seconds on CPU); pay it
            # at start-up, not inside the first training step.
            self.generate([[0]], max_new_tokens=2, temperature=1.0, seed=0)

    def _own_threads(self) -> None:
        """The calling thread's OpenMP team at the engine's size. A thread's first torch op sets it, and a
        Serve replica calls from several threads (requests, the weight-sync thread): a generation thread
        whose first op was vLLM's CPU attention ran it with the default team of one per core while its
        metadata said cpu_threads, and vLLM aborted ("Check failed: input->metadata->thread_num ==
        thread_num (1 vs. 2)", tests/e2e/test_real_model.py once loads moved to the sync thread)."""
        if not self.on_gpu and self.config.cpu_threads is not None:
            import torch

            torch._C.set_num_threads(self.config.cpu_threads)  # vLLM's CPU worker replaces torch.set_num_threads

    @property
    def can_sleep(self) -> bool:
        """Whether sleep() frees memory: a GPU engine built with enable_sleep_mode (vLLM has no sleep
        mode on CPU)."""
        return self.on_gpu and self.config.enable_sleep_mode

    def sleep(self, level: int = 1) -> bool:
        """Colocated placement: hand the accelerator to the learner. Level 1 moves the weights to host memory
        and discards the KV cache (and with it the prefix cache); level 2 discards the weights too (a run
        whose next step loads new weights anyway: no host copy, no copy back). generate() refuses until
        wake_up(). Returns True when the engine sleeps; on CPU, or without enable_sleep_mode, a no-op that
        returns False."""
        if not self.can_sleep:
            return False
        with self._lock:
            if not self.asleep:
                self.llm.sleep(level=level)
                self.asleep, self.slept_level = True, level
        return True

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """Take the accelerator back, all of it (tags None) or in stages: ["weights"] before a weight update
        lands, then ["kv_cache"] before generating (the colocated order, so the update's buffer and the KV
        cache are never allocated together). Returns True when it woke something; False when there was
        nothing to do (CPU, no sleep mode, or awake)."""
        if not (self.can_sleep and self.asleep):
            return False
        with self._lock:
            self.llm.wake_up(tags=tags)
            self._woken |= set(tags or ("weights", "kv_cache"))
            if {"weights", "kv_cache"} <= self._woken:
                self.asleep, self._woken = False, set()
        return True

    def _check_awake(self, what: str) -> None:
        if getattr(self, "asleep", False):
            raise RuntimeError(f"rollout engine: {what} while asleep (its weights are in host memory and it "
                               "has no KV cache); call wake_up() first")

    def generate(
        self,
        prompt_token_ids: list[list[int]],
        samples_per_prompt: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 64,
        seed: int | Sequence[int] | None = None,
        stop_token_ids: list[int] | None = None,
        ignore_eos: bool = False,
        top_k: int | None = None,
        min_p: float | None = None,
        repetition_penalty: float | None = None,
    ) -> list[list[Sample]]:
        """Per prompt, its `samples_per_prompt` samples (same order as the prompts).

        `seed` is a base seed for the batch, or one seed per prompt. top_k, min_p and repetition_penalty: None
        leaves vLLM's default (off). Like temperature and top_p they change which tokens are drawn, not the
        returned log-probs (LOGPROBS_MODE: before every logits processor, penalties included)."""
        self._check_awake("generate")
        self._own_threads()
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if samples_per_prompt < 1:
            raise ValueError(f"samples_per_prompt: {samples_per_prompt}; use 1 or more")
        if not prompt_token_ids:
            return []
        stops = self.stop_token_ids if stop_token_ids is None else list(stop_token_ids)
        seeds = prompt_seeds(seed, len(prompt_token_ids), samples_per_prompt)
        # vLLM refuses n > 1 with greedy decoding: send each greedy copy on its own.
        copies = samples_per_prompt if temperature == 0 else 1
        knobs = {k: v for k, v in (("top_k", top_k), ("min_p", min_p), ("repetition_penalty", repetition_penalty))
                 if v is not None}
        prompts, params = [], []
        for p, s in zip(prompt_token_ids, seeds, strict=True):
            prompts += [TokensPrompt(prompt_token_ids=list(map(int, p))) for _ in range(copies)]
            # One SamplingParams per request: vLLM updates them in place.
            params += [
                SamplingParams(
                    n=samples_per_prompt // copies,
                    temperature=temperature,
                    top_p=top_p,
                    max_tokens=max_new_tokens,
                    seed=s,
                    logprobs=0,  # just the sampled token's logprob
                    stop_token_ids=[] if ignore_eos else stops,
                    ignore_eos=ignore_eos,  # fixed lengths, for benchmarks
                    detokenize=False,
                    **knobs,
                )
                for _ in range(copies)
            ]
        with self._lock:
            lora = self.adapter.request if self.adapter is not None else None
            outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=lora)
            version = self.version
        return group_samples(outputs, len(prompt_token_ids), copies, version)

    def begin_update(self) -> None:
        """A weight transfer starts: no generation until end_update() or abort_update() (the lock is held
        across the transfer's phases, which one thread runs)."""
        if self.asleep and "weights" not in self._woken:
            raise RuntimeError("rollout engine: a weight update while the weights sleep; wake_up(['weights']) first")
        self._lock.acquire()
        self._updating = True
        if self.adapter is not None:
            try:
                self.llm.collective_rpc("rlscale_adapter_begin")
            except BaseException:
                self._release_update()
                raise

    def end_update(self, version: int) -> dict[str, Any]:
        """The transfer finished: caches derived from the old weights go, the version is the new one."""
        try:
            self._after_weights(version)
            return self.transfer_stats()
        finally:
            self._release_update()

    def abort_update(self) -> None:
        """A transfer broke part-way: the weights are a mix, so no request may use them (version -1) until a
        whole update lands."""
        self.version = -1
        self._release_update()

    def _release_update(self) -> None:
        if self._updating:
            self._updating = False
            self._lock.release()

    def _after_weights(self, version: int) -> None:
        if self.adapter is not None:  # the base is unchanged: serve the new adapter
            d = self.adapter.directory(version)
            self.adapter.bytes = self.llm.collective_rpc("rlscale_adapter_save", args=(str(d), self.adapter.alpha))[0]
            self.adapter.swap(self.llm, version, d)
            self.llm.reset_prefix_cache()
            self.version = version
            return
        # CPU: a tied LM head computes from a packed copy of the embedding that the reload does not redo.
        if not self.on_gpu:
            self.llm.collective_rpc("rlscale_refresh_lm_heads")
        # The prefix cache holds KV computed with the old weights, and a prompt longer than one block would
        # silently reuse it.
        self.llm.reset_prefix_cache()
        self.version = version

    def transfer_stats(self) -> dict[str, Any]:
        """The last update's figures on the first worker (bytes received, receive buffers' peak, seconds)."""
        return self.llm.collective_rpc("rlscale_transfer_stats")[0]

    def load_weights(
        self,
        named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        version: int,
    ) -> float:
        """Load HF-named weights held in this process into the engine with vLLM's own reload (its layerwise
        reload, what the transfer engines use too); returns the seconds it took. Tests and benches use it
        for an engine of their own; a run's replicas take weights through rlscale.rollout.transfer."""
        self._check_awake("load_weights")
        self._own_threads()
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        t0 = time.perf_counter()
        with self._lock:
            if self.config.multiprocess or self.config.tensor_parallel_size > 1:
                # Across the engine-process boundary tensors arrive as nested lists: a weights directory.
                self._reload_via_path(items)
            else:
                self.llm.collective_rpc("reload_weights",
                                        kwargs={"weights_iterator": iter([(n, t.detach()) for n, t in items])})
            self._after_weights(version)
        seconds = time.perf_counter() - t0
        remote = self.config.multiprocess or self.config.tensor_parallel_size > 1
        self.last_update = {"path": "directory" if remote else "reload", "seconds": seconds}
        return seconds


    def load_adapter(self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                     version: int) -> float:
        """spec.lora, tensors held in this process (tests, benches): serve them as the adapter of `version`;
        returns the seconds it took. A run's replicas take adapters through rlscale.rollout.transfer."""
        from rlscale.rollout.lora import write_adapter

        if self.adapter is None:
            raise RuntimeError("rollout engine: load_adapter on an engine built without EngineConfig.lora")
        self._check_awake("load_adapter")
        t0 = time.perf_counter()
        tensors = dict(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        with self._lock:
            d = write_adapter({n: t.detach().cpu() for n, t in tensors.items()}, self.adapter.directory(version),
                              self.adapter.alpha)
            self.adapter.swap(self.llm, version, d)
            self.adapter.bytes = sum(t.numel() * t.element_size() for t in tensors.values())
            self.version = version
        seconds = time.perf_counter() - t0
        self.last_update = {"path": "adapter", "seconds": seconds}
        return seconds

    def _reload_via_path(self, items: Iterable[tuple[str, torch.Tensor]]) -> None:
        from safetensors.torch import save_file

        with tempfile.TemporaryDirectory(prefix="rlscale-weights-") as d:
            tensors = {n: t.detach().contiguous().cpu() for n, t in items}
            save_file(tensors, os.path.join(d, "model.safetensors"))
            for name in ("config.json", "generation_config.json"):
                src = Path(self.config.model) / name
                if src.is_file():
                    (Path(d) / name).write_bytes(src.read_bytes())
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": d})

    def close(self) -> None:
        """Drop the engine; vLLM frees its memory when the LLM is collected."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # best effort: the in-process core may have no shutdown
                pass
            self.llm = None
        adapter_dir = getattr(self, "_adapter_dir", None)
        if adapter_dir is not None:
            adapter_dir()


def prompt_seeds(seed: int | Sequence[int] | None, prompts: int, samples_per_prompt: int) -> list[int | None]:
    """One seed per prompt, from a base seed for the batch or one seed per prompt (None: unseeded)."""
    if seed is None or isinstance(seed, int):
        # vLLM gives child j of a prompt seed+j; spacing prompts by n keeps every
        # sample of the batch on its own stream.
        return [None if seed is None else seed + i * samples_per_prompt for i in range(prompts)]
    seeds = list(seed)
    if len(seeds) != prompts:
        raise ValueError(f"seed: {len(seeds)} seeds for {prompts} prompts; give one per prompt")
    return seeds


def group_samples(outputs: Sequence[Any], prompts: int, copies: int, version: int) -> list[list[Sample]]:
    """vLLM's outputs (`copies` requests per prompt, in order) as each prompt's samples."""
    result: list[list[Sample]] = []
    for i in range(prompts):
        group = outputs[i * copies : (i + 1) * copies]
        samples = []
        for comp in (c for out in group for c in sorted(out.outputs, key=lambda c: c.index)):
            ids = list(comp.token_ids)
            # logprobs=0 returns one entry per position: the sampled token's.
            flat = [float(pos[t].logprob) for pos, t in zip(comp.logprobs or [], ids, strict=True)]
            samples.append(Sample(token_ids=ids, logprobs=flat, finish_reason=str(comp.finish_reason),
                                  weights_version=version))
        result.append(samples)
    return result
