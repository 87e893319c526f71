"""The trainer's side of moving weights to the rollout engines (rlscale.rollout.transfer has the workers'
side, the wire format and the control plane): the publisher driving vLLM's trainer engines, rlscale's own
trainer engines for the CPU stand-ins (gloo, shm), the learner's weights as a WeightSource, the trainer
engine on every learner rank where each rank sends (ipc, shm), and the colocated handover of the
accelerator between the learner and the engines."""
