"""The learner's collective methods of a weight transfer (mixed into Learner): each runs on every rank."""

from __future__ import annotations

import importlib
import logging
from typing import Any

import torch

log = logging.getLogger(__name__)


class TransferRanks:
    """Learner methods: the trainer engine of an all-rank backend on every rank, and the colocated handover."""

    transfer_engine: Any = None
    _transfer_client: Any = None

    def transfer_open(self, module: str, cls_name: str, fields: dict, device: str, client: Any) -> None:
        """Rank 0: build the trainer engine on every rank (rank 0 with `client`, the others with none)."""
        self._transfer_client = client
        self._collective("transfer_open", module, cls_name, fields, device)

    def transfer_send(self) -> None:
        self._collective("transfer_send")

    def transfer_close(self) -> None:
        self._collective("transfer_close")

    def _transfer_open(self, module: str, cls_name: str, fields: dict, device: str) -> None:
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

        from rlscale.rollout.transfer import register
        from rlscale.rollout.transfer.control import NullClient
        from rlscale.trainer.transfer.sources import learner_source

        register()
        info = getattr(importlib.import_module(module), cls_name)(rank=self.rank, **fields)
        client = self._transfer_client if self.rank == 0 else NullClient()
        source = learner_source(self, device, all_ranks=True)
        self.transfer_engine = WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)

    def _transfer_send(self) -> None:
        self.transfer_engine.send_weights()

    def _transfer_close(self) -> None:
        engine, self.transfer_engine = self.transfer_engine, None
        if engine is not None:
            engine.shutdown()

    def own_weights(self, dtype: str | None, device: str):
        """Every rank: its own pass of the gather loop, yielding (name, full tensor) on this rank."""
        from rlscale.trainer.weights_export import gather_weights

        target = getattr(torch, dtype) if dtype else None
        if getattr(self, "lora", None) is not None:  # whole on every rank (ZeRO 0-2)
            from rlscale.trainer.lora.policy import sync_items

            return sync_items(self.lora, self.sync_mode, target, device)
        return gather_weights(self.engine.module, self.config.zero_stage == 3, emit=True, dtype=target, device=device)

    # --- colocated: the accelerator's memory handed over, not shared by luck ------------------------------

    def offload_states(self) -> dict[str, float]:
        """Rank 0 (the others follow): DeepSpeed's offload_states to host memory, then the allocator's cache
        emptied, so a waking engine finds the memory free. A no-op on CPU. Returns bytes freed on rank 0."""
        return self._collective("offload_states") or {}

    def reload_states(self) -> None:
        self._collective("reload_states")

    def _offload_states(self) -> dict[str, float]:
        if not torch.cuda.is_available() or self.device.type != "cuda":
            return {}
        before = torch.cuda.memory_reserved(self.device)
        engines = list(filter(None, (self.engine, getattr(self, "critic", None))))
        if getattr(self, "lora", None) is not None:
            # spec.lora: the frozen base is no optimiser state, so DeepSpeed keeps it; it leaves the GPU too
            # (rlscale/plan/lora.py assumes so: a colocated 7B engine needs the card the base would hold).
            from rlscale.trainer.lora.policy import move_frozen

            for engine in engines:
                move_frozen(engine.module, "cpu")
            self._offloaded = True
        if self.config.zero_stage == 0:
            log.warning("colocated: ZeRO stage 0 has no offload_states; the learner's trained states stay on the GPU")
        else:
            for engine in engines:
                engine.offload_states(include=offloadable(engine, self.config.zero_stage))
            self._offloaded = True
        torch.cuda.empty_cache()
        return {"freed_bytes": float(before - torch.cuda.memory_reserved(self.device))}

    def _reload_states(self) -> None:
        if not getattr(self, "_offloaded", False):
            return
        engines = list(filter(None, (self.engine, getattr(self, "critic", None))))
        if getattr(self, "lora", None) is not None:
            from rlscale.trainer.lora.policy import move_frozen

            for engine in engines:
                move_frozen(engine.module, self.device)
        if self.config.zero_stage > 0:
            for engine in engines:
                engine.reload_states()
        self._offloaded = False


_SAID: set[str] = set()


def offloadable(engine: Any, zero_stage: int):
    """What DeepSpeed's offload_states may move (None: everything). At ZeRO-3 it moves the fp32 master weights
    and Adam's state only for its own FusedAdam (an assertion in its stage-3 optimizer); the learner steps with
    torch's AdamW, so those stay on the GPU and the rest goes: the bf16 weights, the gradients and the
    contiguous gradient buffer (make gpu-check's offload check measures what that frees)."""
    from deepspeed.ops.adam import FusedAdam
    from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum as S

    if zero_stage < 3 or isinstance(getattr(engine.optimizer, "optimizer", None), FusedAdam):
        return None
    if "zero3" not in _SAID:
        _SAID.add("zero3")
        log.warning("colocated at ZeRO-3 with torch's AdamW: DeepSpeed offloads the fp32 master weights and Adam's "
                    "state only for its FusedAdam, so they stay on the GPU while the engines generate")
    return [S.lp_params, S.lp_grads, S.contiguous_grad_buffer]
