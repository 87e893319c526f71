"""The learner's weights as a vLLM WeightSource: declared from the parameters' shapes, streamed by gathers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from rlscale.rollout.transfer.sources import StreamSource


def param_meta(learner: Any, dtype: str | None = None) -> list:
    """(HF name, dtype, full shape) of every policy parameter in named_parameters() order, without gathering
    (a ZeRO-3 partition keeps its full shape in ds_shape)."""
    from vllm.distributed.weight_transfer.base import ParamMeta

    target = getattr(torch, dtype) if dtype else None
    out = []
    for name, p in learner.engine.module.named_parameters():
        shape = tuple(getattr(p, "ds_shape", None) or p.shape)
        out.append(ParamMeta(name, target or p.dtype, shape))
    return out


def learner_source(learner: Any, device: str = "cpu", dtype: str | None = None,
                   all_ranks: bool = False) -> StreamSource:
    """Rank 0's source (the other ranks join its gathers from follow()), or with all_ranks every rank's own
    (each runs the gather loop itself and yields, for backends where every rank sends: ipc, shm)."""
    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        if all_ranks:
            return learner.own_weights(dtype, device)
        return learner.iter_weights(dtype, device)

    return StreamSource(lambda: param_meta(learner, dtype), stream)


class LearnerRanks:
    """The trainer engine on every learner rank (ipc, shm with several ranks): rank 0 opens, sends and closes,
    and the other ranks do the same from follow(); rank 0 alone holds the replicas' client."""

    def __init__(self, learner: Any, device: str = "cpu"):
        self.learner, self.device = learner, device
        self.world_size = learner.world_size
        self.source = learner_source(learner, device, all_ranks=True)
        self.engine = None

    def open(self, make_info, client) -> None:
        info = make_info(0)
        fields = {k: v for k, v in vars(info).items() if k != "rank"}
        self.learner.transfer_open(type(info).__module__, type(info).__qualname__, fields, self.device, client)
        self.engine = self.learner.transfer_engine

    def send(self) -> None:
        self.learner.transfer_send()

    def close(self) -> None:
        self.learner.transfer_close()
        self.engine = None
