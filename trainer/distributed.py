"""The learner's process group: one rank per process, from the launcher's environment."""

from __future__ import annotations

import os

import torch.distributed as dist


def skip_inference_all_reduce_op() -> None:
    """On CPU, keep DeepSpeed from compiling its shared-memory all-reduce kernel at comm init.

    Only DeepSpeed's inference all-reduce uses that kernel (training reduces through the process
    group), and building it cost every fresh start over a minute of g++ (docs/measurements.md,
    "DeepSpeed's shared-memory kernel").
    """
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        return
    import deepspeed.ops

    # The op table is computed once and kept in the module; comm init reads it from there.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def use_local_device() -> int | None:
    """On CUDA, make LOCAL_RANK's GPU this process's device before the process group exists: NCCL's
    communicators and every tensor without an explicit device then land there, not all on GPU 0.
    Returns the device index, None on CPU (gloo)."""
    import torch

    if not torch.cuda.is_available():
        return None
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if local >= torch.cuda.device_count():
        raise RuntimeError(f"learner: LOCAL_RANK {local} but this process sees {torch.cuda.device_count()} GPUs; "
                           "ranksPerReplica must not exceed the pod's GPUs (gpusPerReplica)")
    torch.cuda.set_device(local)
    return local


def init_distributed() -> tuple[int, int]:
    """Join the process group from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (defaults: one rank on loopback)."""
    import deepspeed

    skip_inference_all_reduce_op()  # also for a group someone else set up: DeepSpeed's comm init comes later
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    # One rank a pod unless the pod's launcher (trainer/launcher.py, ranksPerReplica) says otherwise.
    os.environ.setdefault("LOCAL_RANK", "0")
    use_local_device()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        if os.environ["WORLD_SIZE"] != "1":
            raise RuntimeError("learner: WORLD_SIZE > 1 needs MASTER_ADDR and MASTER_PORT of rank 0; set them in the "
                               "environment")
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    from rlscale.trainer.gang import leave_the_previous_gang

    leave_the_previous_gang(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), os.environ["MASTER_ADDR"],
                            int(os.environ["MASTER_PORT"]))
    # DeepSpeed picks the backend from its accelerator: gloo on CPU, NCCL on GPU.
    deepspeed.init_distributed(verbose=False)
    return dist.get_rank(), dist.get_world_size()
