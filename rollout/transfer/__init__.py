"""Weights from the learner to the rollout engines through vLLM's weight transfer engines.

vLLM 0.32 moves an RL trainer's weights into live engines with one four-phase protocol (init, start,
update, finish) behind a factory of transports: `nccl` (a broadcast group) and `ipc` (CUDA IPC handles)
on GPUs. rlscale registers two more with that factory for engines on CPUs, `gloo` (the nccl protocol
over a gloo chain) and `shm` (the ipc protocol over shared memory), so the same protocol runs in
`make test` with only the wire swapped. `rlscale.plan.placement.transfer_backend` picks one per run.

Here: the workers' side of those backends, the wire format (buckets) and the control plane (control:
`ReplicaClient` is the trainer engines' `VLLMWeightSyncClient`, fanning each phase out to every replica
through the WeightStore actor). The trainer's side is rlscale.trainer.transfer.
"""

from __future__ import annotations

# name -> (worker engine, trainer engine) as module:class, imported only when vLLM builds one.
RLSCALE_BACKENDS = {
    "gloo": ("rlscale.rollout.transfer.gloo:GlooWeightTransferEngine",
             "rlscale.trainer.transfer.gloo_trainer:GlooTrainerWeightTransferEngine"),
    "shm": ("rlscale.rollout.transfer.shm:ShmWeightTransferEngine",
            "rlscale.trainer.transfer.shm_trainer:ShmTrainerWeightTransferEngine"),
}
# Backends whose every trainer rank takes part in a send (the buffers live on each rank's own device);
# the others send from rank 0 alone while the other ranks only join its gathers.
ALL_RANK_BACKENDS = frozenset({"ipc", "shm"})


def register() -> None:
    """Register rlscale's backends with vLLM's worker and trainer factories (once per process; a vLLM
    worker process registers them when it imports rlscale.rollout.engine, its worker extension)."""
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory, WeightTransferTrainerFactory

    for name, (worker, trainer) in RLSCALE_BACKENDS.items():
        if name not in WeightTransferEngineFactory._registry:
            WeightTransferEngineFactory.register_engine(name, *worker.split(":"))
        if name not in WeightTransferTrainerFactory._registry:
            WeightTransferTrainerFactory.register_engine(name, *trainer.split(":"))
