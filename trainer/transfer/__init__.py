"""The learner's side of moving weights to the rollout engines (rlscale.rollout.transfer has the wire):
its weights as a vLLM WeightSource, the trainer engine on every rank where each rank sends (ipc, shm), and
the colocated handover of the accelerator's memory between the learner and the engines."""
