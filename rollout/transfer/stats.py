"""What the receiving engines share: the worker's rank in a transfer group, vLLM's layerwise reload around
an update, and the figures of the last update (bytes, the receive buffers' peak, the process's peak RSS)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path


def worker_rank(parallel_config) -> int:
    """This worker's rank among every worker of its engine (data-parallel index x TP*PP + rank), as vLLM's
    nccl engine numbers them; a transfer group adds the engine's rank offset."""
    return int(parallel_config.data_parallel_index) * int(parallel_config.world_size) + int(parallel_config.rank)


def layerwise_start(model) -> None:
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

    initialize_layerwise_reload(model)


def layerwise_finish(model, model_config) -> None:
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    finalize_layerwise_reload(model, model_config)


def _status_kib(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Linux: start the process's peak-RSS counter (VmHWM) again from the current RSS."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


@dataclass
class TransferStats:
    """One update's figures on a receiver. `buffer_peak`: the most bytes of receive buffers alive at once;
    `rss_growth`: how far the process's peak RSS rose above its RSS at the start (Linux, else None)."""

    received: int = 0
    forwarded: int = 0
    buffer_peak: int = 0
    buffers: int = 0
    seconds: float = 0.0
    rss_growth: int | None = None
    _alive: int = 0
    _t0: float = 0.0
    _rss0: int | None = None

    def begin(self) -> None:
        self.received = self.forwarded = self.buffer_peak = self.buffers = self._alive = 0
        self.rss_growth = None
        self._rss0 = _status_kib("VmRSS") if reset_peak_rss() else None
        self._t0 = time.perf_counter()

    def hold(self, nbytes: int) -> None:
        self._alive += nbytes
        self.buffers += 1
        self.buffer_peak = max(self.buffer_peak, self._alive)

    def release(self) -> None:
        self._alive = 0

    def end(self) -> None:
        self.seconds = time.perf_counter() - self._t0
        hwm = _status_kib("VmHWM")
        if self._rss0 is not None and hwm is not None:
            self.rss_growth = max(0, hwm - self._rss0) * 1024

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}
