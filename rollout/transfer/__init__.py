"""Weights from the learner to the rollout engines through vLLM's weight transfer engines.

vLLM 0.32 moves an RL trainer's weights into live engines with one four-phase protocol (init, start,
update, finish) behind a factory of transports: `nccl` (a broadcast group) and `ipc` (CUDA IPC handles)
on GPUs. rlscale registers two more with that factory for engines on CPUs, `gloo` (the nccl protocol
over a gloo chain) and `shm` (the ipc protocol over shared memory), so the same protocol runs in
`make test` with only the wire swapped. `rlscale.plan.placement.transfer_backend` picks one per run.

The control plane is rlscale's: `control.ReplicaClient` is the trainer engines' `VLLMWeightSyncClient`,
fanning each phase out to every replica of the rollout application through the WeightStore actor.
"""

from __future__ import annotations

RLSCALE_BACKENDS = {
    "gloo": ("rlscale.rollout.transfer.gloo", "GlooWeightTransferEngine", "GlooTrainerWeightTransferEngine"),
    "shm": ("rlscale.rollout.transfer.shm", "ShmWeightTransferEngine", "ShmTrainerWeightTransferEngine"),
}
# Backends whose every trainer rank takes part in a send (the buffers live on each rank's own device);
# the others send from rank 0 alone while the other ranks only join its gathers.
ALL_RANK_BACKENDS = frozenset({"ipc", "shm"})


def register() -> None:
    """Register rlscale's backends with vLLM's worker and trainer factories (once per process; a vLLM
    worker process registers them when it imports rlscale.rollout.engine, its worker extension)."""
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory, WeightTransferTrainerFactory

    for name, (module, worker_cls, trainer_cls) in RLSCALE_BACKENDS.items():
        if name not in WeightTransferEngineFactory._registry:
            WeightTransferEngineFactory.register_engine(name, module, worker_cls)
        if name not in WeightTransferTrainerFactory._registry:
            WeightTransferTrainerFactory.register_engine(name, module, trainer_cls)
