"""The checks of `make gpu-check` (bench/gpu_check.py drives them; docs/gpu.md says what each decides).

Modules: common (settings, result rows, the 2x gate, the planner), driver (cuInit, preflight), decode
(HF decode against the roofline and the planner), handover (CUDA IPC buckets; shared memory on the CPU;
the NCCL group that must be refused), learner (rlscale's DeepSpeed learner and offload_states, in
learner_worker processes), report (markdown). Each check returns rows (common.row).
"""
