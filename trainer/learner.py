"""The DeepSpeed learner: one rank per process; rank 0 drives, the other ranks follow.

Protocol: every public collective method called on rank 0 first broadcasts its name
and arguments on a gloo control group; ranks > 0 sit in `follow()` and run the same
method. So the driver only ever talks to rank 0, and collectives always match.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from rlscale.trainer import checkpoint
from rlscale.trainer.batching import RolloutBatch
from rlscale.trainer.distributed import init_distributed
from rlscale.trainer.learner_config import LearnerConfig, ValueModel, enable_gradient_checkpointing  # noqa: F401
from rlscale.trainer.logprobs import response_logprobs
from rlscale.trainer.lr_schedule import lr_factor
from rlscale.trainer.noise import NoiseScale, boundary_pair, in_batch_samples, local_grad_sq, partition_grad_sq
from rlscale.trainer.objectives import objective_for
from rlscale.trainer.transfer.ranks import TransferRanks
from rlscale.trainer.updates import Norm, Updates
from rlscale.trainer.weights_export import BUCKET_BYTES, gather_weights

log = logging.getLogger(__name__)


class Learner(Updates, TransferRanks):
    """One DeepSpeed rank of the policy (and critic, for PPO); see the module docstring."""

    def __init__(self, config: LearnerConfig):
        import deepspeed
        from transformers import AutoModelForCausalLM

        self.config = config
        self.objective = objective_for(config)  # before any collective: a bad name fails every rank alike
        self.rank, self.world_size = init_distributed()
        # Control messages travel on gloo even when gradients use NCCL.
        self._control = dist.new_group(backend="gloo") if self.world_size > 1 else None
        torch.manual_seed(config.seed)
        # Ranks with a checkpoint volume each (a claim per StatefulSet pod) must each write a
        # complete checkpoint, model states included: rank 0's files are not on their volumes.
        self.per_rank_checkpoints = self._checkpoints_per_rank()
        self._released = False  # rank 0 has told the followers to stop
        self.dtype = getattr(torch, config.dtype)
        policy = AutoModelForCausalLM.from_pretrained(config.model_path, dtype=self.dtype, local_files_only=True)
        if config.gradient_checkpointing:
            enable_gradient_checkpointing(policy)
        self.lora = None  # spec.lora: the PeftModel (trainer/lora); the optimiser then holds its adapter alone
        if config.lora is not None:
            from rlscale.trainer.lora import policy as lora_policy

            if config.zero_stage == 3:
                raise ValueError("spec.learner.zeroStage: 3 with spec.lora; use 0-2 (rlscale validate says why)")
            if config.gradient_checkpointing:
                policy.enable_input_require_grads()  # the frozen embedding's output must carry a graph
            policy = self.lora = lora_policy.wrap(policy, config.lora)
        params = [p for p in policy.parameters() if p.requires_grad]
        self.engine, *_ = deepspeed.initialize(model=policy, model_parameters=params, config=self._ds_config())
        self._grad_norm: float | None = None  # the last step's, when the learner clips (see _clips_itself)
        if self._clips_itself():
            self._install_clip()
        # DeepSpeed has placed the model on this rank's device (LOCAL_RANK's GPU, or the CPU).
        self.device = self.engine.device
        self.critic = None
        if self.objective.uses_critic:
            critic = ValueModel(config.model_path, self.dtype)
            if config.gradient_checkpointing:
                enable_gradient_checkpointing(critic)
            if config.lora is not None:  # the critic's body gets an adapter of its own; its head trains whole
                critic.body = lora_policy.wrap(critic.body, {**config.lora, "modules_to_save": None})
            self.critic, *_ = deepspeed.initialize(model=critic, config=self._ds_config(),
                                                   model_parameters=[p for p in critic.parameters() if p.requires_grad])
        self.reference = self._build_reference() if config.kl_coef > 0 else None
        self.lr = config.lr
        self.steps = 0  # learner steps taken (batches trained; the learning-rate warm-up counts these)
        self.optimizer_steps = 0  # optimiser steps applied: epochs x mini-batches per learner step
        self.noise = NoiseScale(config.noise_ema)
        # Every rank is up: from here on a rank that dies takes the others down (trainer/gang.py).
        from rlscale.trainer.gang import GangWatch

        self.gang = GangWatch(self.rank, self.world_size, os.environ.get("MASTER_ADDR", "127.0.0.1"),
                              int(os.environ.get("MASTER_PORT", "0") or 0),
                              interval=float(os.environ.get("RLSCALE_GANG_INTERVAL", "5")),
                              patience=float(os.environ.get("RLSCALE_GANG_PATIENCE", "30")))
        self._barrier()
        self.gang.start()

    def _build_reference(self):
        """The frozen starting policy. At ZeRO-3 a DeepSpeed engine without optimiser, sharded over the
        ranks like the policy (its forward is collective, as the policy's is); below, whole on each rank
        (the policy's parameters are whole there too)."""
        import deepspeed
        from transformers import AutoModelForCausalLM

        if self.lora is not None:
            from rlscale.trainer.lora.policy import Reference

            return Reference(self.engine, self.lora)  # the base is the policy with its adapter off
        reference = AutoModelForCausalLM.from_pretrained(self.config.model_path, dtype=self.dtype,
                                                         local_files_only=True)
        reference.eval().requires_grad_(False)
        if self.config.zero_stage < 3:
            return reference.to(self.device)
        cfg = {k: v for k, v in self._ds_config().items() if k not in ("optimizer", "scheduler")}
        engine, *_ = deepspeed.initialize(model=reference, config=cfg)
        engine.module.eval()
        return engine

    def _clips_itself(self) -> bool:
        """True where DeepSpeed would clip but not keep the norm: float32 without ZeRO, where it hands
        the gradients to the plain torch optimiser and discards clip_grad_norm_'s return value, so
        get_global_grad_norm() stays None (DeepSpeed 0.19.8, engine._take_model_step). The learner clips
        there itself, with the same formula; tests/trainer/test_learner_diagnostics.py checks the norm
        against a float64 reference at ZeRO 0 and 1, test_learner_distributed.py on two ranks."""
        return self.config.zero_stage == 0 and self.config.dtype == "float32"

    def _install_clip(self) -> None:
        optimizer = self.engine.optimizer
        if optimizer is not getattr(self.engine, "basic_optimizer", None):
            raise RuntimeError(f"learner: DeepSpeed wrapped the optimiser in {type(optimizer).__name__} at "
                               f"learner.zeroStage 0 and model.dtype float32; the learner expected the plain "
                               "optimiser to clip its gradients; use learner.zeroStage 1")
        params = [p for p in self.engine.module.parameters() if p.requires_grad]
        clip = self.config.grad_clip

        def clip_before_step(*_):
            # Runs inside engine.step(), after DeepSpeed's all-reduce: every rank sees the same gradient.
            grads = [p.grad for p in params if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads)
            if clip > 0:
                torch.nn.utils.clip_grads_with_norm_(params, clip, norm)
            self._grad_norm = float(norm)

        optimizer.register_step_pre_hook(clip_before_step)

    def _ds_config(self) -> dict:
        c = self.config
        cfg = {
            "train_micro_batch_size_per_gpu": c.micro_batch,
            "gradient_accumulation_steps": 1,
            "train_batch_size": c.micro_batch * self.world_size,
            # The learner decides the boundary: backward only accumulates, step() reduces
            # and updates, so one optimiser step covers a batch of any size.
            "managed_gradient_accumulation": False,
            "gradient_clipping": 0.0 if self._clips_itself() else c.grad_clip,
            "optimizer": {
                "type": "AdamW",
                # torch's AdamW: DeepSpeed's own CPU FusedAdam costs a ~55 s compile.
                "params": {"lr": c.lr, "betas": list(c.betas), "eps": c.eps, "weight_decay": c.weight_decay,
                           "torch_adam": True},
            },
            "zero_optimization": {"stage": c.zero_stage},
            "bf16": {"enabled": c.dtype == "bfloat16"},
            "fp16": {"enabled": c.dtype == "float16"},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
            # Every rank writes the model states too when it has a volume of its own.
            "checkpoint": {"use_node_local_storage": self.per_rank_checkpoints},
        }
        cfg.update(c.extra_ds_config)
        return cfg

    # --- the rank-0 API, collective underneath -----------------------------------

    def _collective(self, name: str, *args):
        if self.world_size > 1 and self.rank == 0:
            dist.broadcast_object_list([name, args], src=0, group=self._control)
        return getattr(self, "_" + name)(*args)

    def step(self, batch: RolloutBatch | dict, lr: float | None = None) -> dict[str, float | None]:
        """Train on the batch (rank 0; followers join): spec.algorithm.epochs x miniBatches optimiser steps
        (trainer/updates.py); returns stats, with skipped=1.0 when no group had a reward signal (no step, the
        weights unchanged).

        `batch` is a RolloutBatch or a dict of its fields (see RolloutBatch.from_dict).
        """
        if isinstance(batch, dict):
            batch = RolloutBatch.from_dict(batch)
        return self._collective("step", batch, lr)

    def export_weights(self, dtype: str | None = None) -> dict[str, torch.Tensor]:
        """Full policy weights under HF names on CPU (rank 0; followers join); built from iter_weights, so
        under ZeRO-3 a rank holds one gathered bucket at a time besides the CPU copies."""
        return dict(self.iter_weights(dtype))

    def iter_weights(self, dtype: str | None = None, device: str | torch.device = "cpu",
                     bucket_bytes: int = BUCKET_BYTES) -> Iterator[tuple[str, torch.Tensor]]:
        """Rank 0: yield (HF name, tensor) for every policy parameter, in named_parameters() order (tied
        weights once), each a copy on `device` ("cpu" for the object store; the rank's device, e.g.
        learner.device, for a NCCL broadcast) in `dtype` (a torch dtype name; None: the learner's).

        Collective under ZeRO-3: on its first item rank 0 tells the followers (in follow()) to run the
        same gather loop; parameters are gathered a bucket of at most bucket_bytes at a time (one
        parameter when larger) and released before the next, so no rank ever holds the whole model.
        Consume it to the end, or close() it: a closed generator still runs the remaining gathers
        (without copies) so the followers finish. Do not run another collective method (step,
        save_checkpoint, ...) while it is open. Ranks > 0 never call it (they follow).
        """
        if self.rank != 0:
            raise RuntimeError("learner: iter_weights runs on rank 0; ranks > 0 join it from follow()")
        if self.world_size > 1:
            dist.broadcast_object_list(["weights", (dtype, str(device), bucket_bytes)], src=0, group=self._control)
        yield from self._weights(dtype, str(device), bucket_bytes)

    @property
    def sync_mode(self) -> str:
        """What publish sends: "full", "adapter" or "merged" (trainer/lora/policy.py, sync_mode)."""
        from rlscale.trainer.lora.policy import sync_mode

        return sync_mode(self.config.lora)

    def sync_weights(self, dtype: str | None = None, device: str | torch.device = "cpu"
                     ) -> Iterator[tuple[str, torch.Tensor]]:
        """Rank 0: what a weight update sends: with spec.lora the adapter (or the merged weights, sync_mode),
        each tensor a copy; without it iter_weights."""
        if self.lora is None:
            yield from self.iter_weights(dtype, device)
            return
        from rlscale.trainer.lora.policy import sync_items

        yield from sync_items(self.lora, self.sync_mode, getattr(torch, dtype) if dtype else None, str(device))

    def stream_weights(self, consumer: Callable[[str, torch.Tensor], None], dtype: str | None = None,
                       device: str | torch.device = "cpu", bucket_bytes: int = BUCKET_BYTES) -> int:
        """Rank 0: consumer(name, tensor) for every policy parameter (see iter_weights), while the followers
        take part in the gathers; returns the bytes handed to the consumer. A tensor may be kept: each is
        a copy. On rank 0, the consumer may run its own collectives (a NCCL broadcast to rollout engines)."""
        total = 0
        for name, tensor in self.iter_weights(dtype, device, bucket_bytes):
            consumer(name, tensor)
            total += tensor.numel() * tensor.element_size()
        return total

    def save_checkpoint(self, directory: str | Path, state: dict | None = None, keep: int = 2) -> Path | None:
        """Atomically checkpoint the engines plus `state` (the driver's run state) under directory."""
        directory = Path(directory)
        name = checkpoint.step_name(int((state or {}).get("step", self.steps)))
        return self._collective("save_checkpoint", str(directory), name, state or {}, keep)

    def load_checkpoint(self, directory: str | Path) -> dict | None:
        """Restore the newest checkpoint under directory that every rank completed; returns the saved
        run state, or None if there is none."""
        if self.per_rank_checkpoints and self.world_size > 1:
            # Each rank renames its own copy: a kill between two ranks' renames leaves them at
            # different newest steps, so the ranks agree on the newest step they all have.
            return self._collective("load_common_checkpoint", str(directory))
        path = checkpoint.latest_checkpoint(directory)
        if path is None:
            return None
        return self._collective("load_checkpoint", str(path))

    def shutdown(self, failed: bool = False) -> None:
        """Release the followers (rank 0; once, however often it is called). `failed`: rank 0 stops
        on an error and its pod restarts, so the followers restart with it (a gang restart) instead
        of waiting for the run's end."""
        if self.world_size > 1 and self.rank == 0 and not self._released:
            self._released = True
            if failed:
                # The watch stays armed: after a rank's death this broadcast may wait on the dead
                # process's half until the group's timeout, and the watch's exit is the way out.
                dist.broadcast_object_list(["stop", ("failed",)], src=0, group=self._control)
                self.gang.stop()
                return
            self.gang.stop()  # the followers leave now, on purpose
            dist.broadcast_object_list(["stop", ("ended",)], src=0, group=self._control)

    def follow(self) -> str:
        """Ranks > 0: run whatever rank 0 runs, until it calls shutdown(); returns why it did:
        "ended" (the run is over) or "failed" (rank 0 stops on an error and restarts)."""
        if self.rank == 0:
            raise RuntimeError("learner: rank 0 drives the run; follow() is for ranks > 0")
        while True:
            msg = [None, None]
            dist.broadcast_object_list(msg, src=0, group=self._control)
            name, args = msg
            if name == "stop":
                self.gang.stop()
                return args[0] if args else "ended"
            getattr(self, "_" + name)(*args)

    # --- what every rank runs ------------------------------------------------------

    def _set_lr(self, lr: float) -> None:
        # Warm-up and decay as a multiplier of the planned lr, at the position self.steps (which a checkpoint
        # restores), so a re-planned lr keeps the schedule (trainer/lr_schedule.py).
        c = self.config
        factor = lr_factor(self.steps, c.lr_schedule, c.warmup_steps, c.decay_steps)
        for engine in filter(None, (self.engine, self.critic)):
            for group in engine.optimizer.param_groups:
                group["lr"] = lr * factor

    def _weights(self, dtype: str | None, device: str, bucket_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
        """Every rank: the gather loop of iter_weights; yields on rank 0 only. A follower runs it whole."""
        target = getattr(torch, dtype) if dtype else None
        if self.lora is not None:  # whole on every rank (ZeRO 0-2): the merged weights, nothing to gather
            from rlscale.trainer.lora.policy import merged_items

            return merged_items(self.lora, target, device) if self.rank == 0 else iter(())
        gen = gather_weights(self.engine.module, self.config.zero_stage == 3, emit=self.rank == 0, dtype=target,
                             device=device if self.rank == 0 else "cpu", bucket_bytes=bucket_bytes)
        if self.rank == 0:
            return gen
        for _ in gen:
            pass
        return iter(())

    def _current_lr(self) -> float:
        return float(self.engine.optimizer.param_groups[0]["lr"])

    def _forward_logprobs(self, model, mb, entropy_grad: bool = False):
        """(log-probs, entropy) [B, T] of the response tokens, the float32 logits chunk by chunk."""
        return response_logprobs(model, mb, self.config.logprob_chunk, entropy_grad=entropy_grad)

    def _logprobs(self, model, mb) -> torch.Tensor:
        return self._forward_logprobs(model, mb)[0]

    def _critic_values(self, mb) -> torch.Tensor:
        return self.critic(mb.input_ids, mb.attention_mask).gather(1, mb.logit_index)

    # --- gradient noise scale --------------------------------------------------------

    def _grad_sq(self) -> float:
        """This rank's term of |g|^2 of the gradient accumulated so far: at ZeRO 0/1 the rank's own
        (unreduced) gradient; at ZeRO 2/3 its partition of the ranks' reduced gradient (summed over ranks
        in _update_noise)."""
        if self.config.zero_stage >= 2:
            return partition_grad_sq(self.engine)
        return local_grad_sq(self.engine.module)

    def _noise_estimates(self, small_sq: float | None, packed: list, boundary: int | None, norm: Norm,
                         trained: int, batch: int):
        """(noise scale, this step's raw |G|^2, its tr(Sigma)), in samples of the whole batch (see
        trainer/noise.py); the raw pair is None when not measured. Measured in the step's first optimiser
        step, at the weights the batch starts from: `packed` and `norm` are the first mini-batch's (the
        whole batch's with one mini-batch)."""
        self.noise.last = None
        noise = None
        if small_sq is not None and boundary is not None:
            noise = self._update_noise(small_sq, packed, boundary, norm, trained, batch)
        g_sq, trace = self.noise.last or (None, None)
        return (float(noise) if noise is not None else self.noise.value), g_sq, trace

    def _update_noise(self, small_sq: float, packed: list, boundary: int, norm: Norm, trained: int,
                      batch: int) -> float | None:
        """B_simple from the gradient at the group-aligned boundary (the first part of the groups) vs the
        whole: per rank at ZeRO 0/1 (each rank's pair, averaged over ranks), over all ranks at ZeRO 2/3
        (the reduced gradient: small = every rank's first part, big = the whole batch)."""
        big_sq = self._grad_sq()
        part = packed[:boundary]
        # [|g_small|^2, |g_big|^2, samples small, big, loss tokens small, big]
        v = torch.tensor([small_sq, big_sq, sum(mb.num_samples for mb in part), sum(mb.num_samples for mb in packed),
                          sum(mb.mask.sum().item() for mb in part), sum(mb.mask.sum().item() for mb in packed)],
                         dtype=torch.float64)
        global_ = self.config.zero_stage >= 2
        ranks = self.world_size if global_ else 1
        if global_:
            v = self._all_sum(v)
        small_sq, big_sq, b_small, b_big, t_small, t_big = v.tolist()
        # The losses were divided by the batch's count per rank (tokens under token-mean, sequences under
        # the sequence aggregations) and DeepSpeed averages the ranks.
        token_mean = self.config.loss_aggregation == "token-mean"
        denom = (norm.tokens if token_mean else norm.sequences) * ranks
        sizes = (t_small, t_big) if token_mean else (b_small, b_big)
        pair = torch.tensor(boundary_pair(small_sq, big_sq, b_small, b_big, sizes, denom), dtype=torch.float64)
        if self.world_size > 1 and not global_:
            pair = self._all_sum(pair) / self.world_size
        self._noise_norms = (small_sq, big_sq)  # the raw squared norms, for tests
        return self.noise.add(*in_batch_samples(pair[0].item(), pair[1].item(), trained, batch))

    # --- weights and checkpoints -------------------------------------------------------

    def _engines(self):
        return [(self.engine, "policy")] + ([(self.critic, "critic")] if self.critic is not None else [])

    def _checkpoints_per_rank(self) -> bool:
        """True when this run's ranks do not see one checkpoint directory (rank 0 writes a probe
        file; a rank that cannot read it has a volume of its own). Collective."""
        d = self.config.checkpoint_dir
        if self.world_size == 1 or not d:
            return False
        token = [secrets.token_hex(8) if self.rank == 0 else None]
        dist.broadcast_object_list(token, src=0, group=self._control)
        probe = Path(d) / f".rank0-probe-{token[0]}"
        if self.rank == 0:
            probe.parent.mkdir(parents=True, exist_ok=True)
            probe.write_text(token[0])
        self._barrier()
        try:
            sees = probe.read_text() == token[0]
        except OSError:
            sees = False
        seen = torch.tensor([1 if sees else 0])
        dist.all_reduce(seen, op=dist.ReduceOp.MIN, group=self._control)
        self._barrier()
        if self.rank == 0:
            probe.unlink(missing_ok=True)
        return not bool(seen.item())

    def _checkpoint_dir(self, directory: str) -> Path:
        """Rank 0 names the directory; a rank with a volume of its own uses its configured one."""
        if self.per_rank_checkpoints and self.config.checkpoint_dir:
            return Path(self.config.checkpoint_dir)
        return Path(directory)

    def _save_checkpoint(self, directory: str, name: str, state: dict, keep: int) -> Path | None:
        base = self._checkpoint_dir(directory)
        final = base / name
        tmp = base / f".tmp-{name}"
        # Who completes a checkpoint: rank 0 in a shared directory, every rank in its own.
        owner = self.rank == 0 or self.per_rank_checkpoints
        if owner:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self._barrier()
        for engine, tag in self._engines():
            # LoRA: the adapter (and its optimiser states) only; the frozen base is the model directory's.
            engine.save_checkpoint(str(tmp), tag=tag, save_latest=False,
                                   exclude_frozen_parameters=self.lora is not None)
        self._barrier()  # every rank's shards are on disk before the rename makes them visible
        result = None
        if owner:
            learner_state = {"steps": self.steps, "optimizer_steps": self.optimizer_steps, "lr": self.lr,
                             "noise": self.noise.state_dict(), "lora": self._lora_state()}
            result = checkpoint.finish(tmp, final, {"run": state, "learner": learner_state}, keep)
        self._barrier()
        return result if self.rank == 0 else None

    def _load_common_checkpoint(self, directory: str) -> dict | None:
        base = self._checkpoint_dir(directory)
        mine = [checkpoint.step_of(p) for p in checkpoint.complete_steps(base)]
        everyone: list[list[int] | None] = [None] * self.world_size
        dist.all_gather_object(everyone, mine, group=self._control)
        step, skipped = checkpoint.newest_common_step(everyone)
        if skipped and self.rank == 0:
            log.warning("learner: checkpoint steps %s are not complete on every rank (a save was cut short "
                        "between ranks); resuming from the newest complete on all: %s", skipped, step)
        for newer in skipped:
            # This rank's copy of an abandoned step: set aside (the next save removes it), so that
            # neither `latest` nor the pruning take it for the newest.
            own = base / checkpoint.step_name(newer)
            if own.is_dir():
                own.rename(base / f".old-{own.name}")
        if step is None:
            return None
        return self._load_checkpoint(str(base / checkpoint.step_name(step)))

    def _load_checkpoint(self, path: str) -> dict:
        # Rank 0 chose the step; every rank reads that step from the directory it writes to.
        path = str(self._checkpoint_dir(str(Path(path).parent)) / Path(path).name)
        saved = checkpoint.read_state(Path(path))
        if saved["learner"].get("lora") is not None or self.lora is not None:  # an adapter fits one base
            from rlscale.trainer.lora.identity import base_identity, check_same_base

            check_same_base(saved["learner"].get("lora"), base_identity(self.config.model_path), self.config.lora,
                            path)
        for engine, tag in self._engines():
            loaded, _ = engine.load_checkpoint(path, tag=tag, load_module_strict=self.lora is None)
            if loaded is None:
                raise RuntimeError(f"learner: checkpoint {path} has no DeepSpeed state {tag!r}; delete it to start "
                                   "afresh")
        ls = saved["learner"]
        self.steps, self.lr = ls["steps"], ls["lr"]
        self.optimizer_steps = ls.get("optimizer_steps", self.steps)  # older checkpoints: one per step
        self.noise.load_state_dict(ls["noise"])
        return saved["run"]

    def _lora_state(self) -> dict | None:
        """What a LoRA checkpoint is tied to: the base model's identity and the adapter's configuration."""
        if self.lora is None:
            return None
        from rlscale.trainer.lora.identity import base_identity

        return {"base": base_identity(self.config.model_path), "config": self.config.lora}

    def _barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self._control)
