"""The learner's step: advantages once over the whole batch, then spec.algorithm.epochs passes over it,
each taking spec.algorithm.miniBatches optimiser steps over whole prompt groups (docs/algorithms.md,
"Several updates per batch").

pi_old is the learner's own log-probs of every sample before the step's first update: the first
mini-batch's come from its first forward, the others' from a forward without gradient before that
update. With one epoch and one mini-batch, pi_old is the current policy and every ratio is 1.

`Updates` is a mixin of rlscale.trainer.learner.Learner: it reads the engines, the config, the
objective and the rank layout from the learner, and calls its noise-scale and learning-rate methods.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist

from rlscale.trainer import advantages as V
from rlscale.trainer import algorithms as A
from rlscale.trainer import losses as L
from rlscale.trainer.batching import MicroBatch, MicroPlan, RolloutBatch, mini_batch_groups, pack, plan_micro_batches

# Stats measured once per token (in the first pass, before any update); the others are summed over
# every optimiser step's forward and averaged over the passes.
ONCE = frozenset({"logprob_diff", "logprob_abs_diff", "is_weight_mean", "is_truncated_fraction"})


@dataclass(frozen=True)
class Norm:
    """A mini-batch's token and sequence counts per rank (DeepSpeed averages the ranks' gradients):
    micro-batch losses aggregated with these add up, over micro-batches and ranks, to the mini-batch's loss."""

    tokens: float
    sequences: float


@dataclass
class MiniBatch:
    """One optimiser step's share of this rank: its micro-batches, and the mini-batch's normaliser."""

    plan: MicroPlan
    packed: list[MicroBatch]
    norm: Norm


class Updates:
    """The step (every rank runs it); see the module docstring."""

    def _step(self, batch: RolloutBatch, lr: float | None) -> dict[str, float]:
        start = time.perf_counter()
        c = self.config
        if c.is_cap is not None and batch.rollout_logprobs is None:
            raise ValueError("learner: spec.algorithm.isCap weights each token by pi_old / pi_behaviour and needs "
                             "the sampler's log-probs as generated (RolloutBatch.rollout_logprobs); pass them, or "
                             "unset isCap")
        if lr is not None:
            self.lr = lr
        self._set_lr(self.lr)
        spp = batch.samples_per_prompt
        rewards, in_loss = self._training_rewards(batch)
        advantages, kept_groups = self.objective.advantages(batch, rewards, in_loss)
        # A group whose every sample left the loss (overlong filtering) has nothing to train.
        groups = [[g * spp + j for j in range(spp) if in_loss[g * spp + j]] for g in kept_groups]
        groups = [g for g in groups if g]
        kept = [i for g in groups for i in g]
        stats: dict[str, float] = {"reward_mean": sum(batch.rewards) / len(batch), "samples": float(len(batch)),
                                   "samples_trained": float(len(kept)),
                                   "mixed_group_fraction": A.mixed_group_fraction(rewards, spp)}
        if not kept:
            # Every group scored uniformly: nothing to learn, no step, the weights unchanged.
            elapsed = time.perf_counter() - start
            stats.update(skipped=1.0, train_seconds=elapsed, compute_seconds=elapsed, lr=self.lr,
                         loss=None, grad_norm=None, noise_scale=self.noise.value, optimizer_steps=0)
            return stats

        total_tokens = sum(batch.model_tokens(i) for i in kept)
        minis = self._mini_batches(batch, groups, advantages, rewards, in_loss)
        self.objective.prepare([mb for m in minis for mb in m.packed], self._logprobs,
                               self._critic_values if self.critic is not None else None,
                               self.engine, self.reference, self._all_sum)
        self._old_logprobs(minis[1:])
        sums, (noise_scale, noise_g_sq, noise_trace), grad_norms = self._updates(
            minis, batch.rollout_logprobs is not None, len(kept), len(batch))
        self.steps += 1

        stats.update(self._reduce(sums, total_tokens, c.epochs))
        # Each before clipping, over its mini-batch's gradient (all ranks); their mean over the optimiser steps.
        grad_norm = None if None in grad_norms else sum(grad_norms) / len(grad_norms)
        stats.update(
            lr=self._current_lr(),
            tokens=float(total_tokens),
            grad_norm=grad_norm,
            noise_scale=noise_scale,
            # This step's raw estimates: a reader averaging them over many steps gets a far
            # steadier B_simple than any one step's (see rlscale.plan.calibration).
            noise_grad_sq=noise_g_sq,
            noise_trace=noise_trace,
            optimizer_steps=len(grad_norms),
            skipped=0.0,
        )
        stats["loss"] = self.objective.total_loss(stats)
        stats["train_seconds"] = stats["compute_seconds"] = time.perf_counter() - start
        return stats

    def _updates(self, minis: list[MiniBatch], has_rollout_logprobs: bool, trained: int, batch: int):
        """epochs x len(minis) optimiser steps, in order; returns the summed stats, the noise estimates (measured
        in the first optimiser step, see _noise_estimates) and each optimiser step's gradient norm."""
        sums: dict[str, float] = {}
        noise, grad_norms = None, []
        for epoch in range(self.config.epochs):
            for m, mini in enumerate(minis):
                first = epoch == 0 and m == 0
                boundary = mini.plan.boundary if first else None
                part, small_sq = self._backward(mini.packed, mini.norm, boundary, has_rollout_logprobs, epoch == 0)
                for key, value in part.items():
                    sums[key] = sums.get(key, 0.0) + value
                if first:
                    noise = self._noise_estimates(small_sq, mini.packed, boundary, mini.norm, trained, batch)
                grad_norms.append(self._optimizer_step())
        return sums, noise, grad_norms

    def _optimizer_step(self) -> float | None:
        """Reduce and apply the accumulated gradient (policy and critic); the policy's norm before clipping."""
        self._grad_norm = None
        self.engine.step()
        if self.critic is not None:
            self.critic.step()
        self.optimizer_steps += 1
        norm = self.engine.get_global_grad_norm() if self._grad_norm is None else self._grad_norm
        return float(norm) if norm is not None else None

    def _training_rewards(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The rewards the advantages come from (the task's, plus DAPO's overlong penalty when configured),
        and per sample whether its tokens enter the loss (not when overlong filtering drops it)."""
        c = self.config
        lengths = torch.tensor([len(r) for r in batch.response_ids])
        rewards = V.training_rewards(torch.tensor(batch.rewards, dtype=torch.float32), lengths,
                                     max_length=c.max_response_length, buffer=c.overlong_buffer,
                                     factor=c.overlong_penalty_factor)
        in_loss = torch.ones(len(batch), dtype=torch.bool)
        if c.mask_truncated:
            if batch.truncated is None:
                raise ValueError("learner: spec.algorithm.maskTruncatedCompletions needs the batch's truncated "
                                 "flags (RolloutBatch.truncated); pass them, or turn it off")
            in_loss = ~torch.tensor(batch.truncated, dtype=torch.bool)
        return rewards, in_loss

    def _all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """A CPU tensor summed over the ranks (the control group)."""
        if self.world_size > 1:
            t = t.clone()
            dist.all_reduce(t, group=self._control)
        return t

    def _mini_batches(self, batch: RolloutBatch, groups: list[list[int]], advantages: torch.Tensor,
                      rewards: torch.Tensor, in_loss: torch.Tensor) -> list[MiniBatch]:
        """The trained groups in mini-batches of whole groups (batching.mini_batch_groups), the same on every
        rank; each rank packs its share of each (every world_size-th group of the mini-batch), and each loss
        is normalised by its mini-batch's totals."""
        out = []
        for m, part in enumerate(mini_batch_groups(groups, self.config.mini_batches)):
            plan = self._my_micro_batches(batch, part, measure=m == 0)
            packed = [pack(batch, idx, advantages, self.device, rewards=rewards, in_loss=in_loss)
                      for idx in plan.chunks]
            samples = [i for g in part for i in g]
            tokens = sum(batch.model_tokens(i) for i in samples)
            out.append(MiniBatch(plan, packed, Norm(tokens / self.world_size, len(samples) / self.world_size)))
        return out

    def _my_micro_batches(self, batch: RolloutBatch, groups: list[list[int]], measure: bool = True) -> MicroPlan:
        """This rank's share of `groups` (every world_size-th) in micro-batches of at most micro_batch
        sequences and micro_batch_tokens padded tokens; when `measure` and the step measures the noise scale,
        with a group-aligned boundary (MicroPlan). Every rank gets the same count (see pack)."""
        c = self.config
        # ZeRO 0/1 compare each rank's part with its share, so each rank needs two groups; ZeRO 2/3
        # compare the ranks' first parts together with the whole batch.
        need = 2 * self.world_size if c.zero_stage < 2 else 2
        split = measure and c.measure_noise and len(groups) >= need
        lengths = [len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids, strict=True)]
        return plan_micro_batches(groups, self.rank, self.world_size, lengths, c.micro_batch, c.micro_batch_tokens,
                                  split=split)

    @torch.no_grad()
    def _old_logprobs(self, minis: list[MiniBatch]) -> None:
        """pi_old of these mini-batches, before the step's first update (the first mini-batch's comes from
        its own forward in that update). A forward per micro-batch, on every rank alike (ZeRO-3's is collective)."""
        for mini in minis:
            for mb in mini.packed:
                mb.old_logprobs = self._logprobs(self.engine, mb)

    def _backward(self, packed: list[MicroBatch], norm: Norm, boundary: int | None, has_rollout_logprobs: bool,
                  first_pass: bool = True) -> tuple[dict[str, float], float | None]:
        """Backward over a mini-batch's micro-batches; returns the summed token-weighted stats and, when
        measuring (boundary set), this rank's |g|^2 term after the first `boundary` micro-batches (_grad_sq)."""
        keys = ["policy_loss", "kl", "entropy", "clip_fraction", "value_loss"]
        if self.reference is not None and self.objective.kl_in_loss:
            keys.append("kl_loss")
        if has_rollout_logprobs and first_pass:  # absent, the mismatch is unknown, not 0
            keys += ["logprob_diff", "logprob_abs_diff"]
        if self.config.is_cap is not None and first_pass:
            keys += ["is_weight_mean", "is_truncated_fraction"]
        sums = dict.fromkeys(keys, 0.0)
        small_sq = None
        for k, mb in enumerate(packed):
            for key, value in self._micro_step(mb, norm, first_pass).items():
                sums[key] = sums.get(key, 0.0) + value
            if boundary is not None and k + 1 == boundary:
                small_sq = self._grad_sq()
        return sums, small_sq

    def _reduce(self, sums: dict[str, float], total_tokens: int, passes: int = 1) -> dict[str, float]:
        """Per-rank sums of token-weighted stats, summed over ranks, per token of the batch (and per pass,
        for those summed over every pass)."""
        keys = sorted(sums)
        reduced = torch.tensor([sums[k] for k in keys], dtype=torch.float64)
        if self.world_size > 1:
            dist.all_reduce(reduced, group=self._control)
        return {k: v / (total_tokens if k in ONCE else total_tokens * passes)
                for k, v in zip(keys, reduced.tolist(), strict=True)}

    def _micro_step(self, mb: MicroBatch, norm: Norm, first_pass: bool = True) -> dict[str, float]:
        """Forward and backward of one micro-batch. Each loss is aggregated with the mini-batch's totals
        (norm), so the micro-batches' gradients add up to the mini-batch's; the stats it returns are sums
        that _reduce divides by the batch's token count (losses x norm.tokens, so they come out as the
        token-weighted mean of the optimiser steps' losses)."""
        c = self.config
        logprobs, entropy = self._forward_logprobs(self.engine, mb, entropy_grad=bool(c.entropy_coef))
        if mb.old_logprobs is None:
            # The step's first update: the parameters are still pi_old.
            mb.old_logprobs = logprobs.detach()
        agg = partial(L.aggregate, mode=c.loss_aggregation, tokens=norm.tokens, sequences=norm.sequences,
                      max_length=c.max_response_length)
        loss, out = self._policy_terms(mb, logprobs, agg, first_pass)
        out["policy_loss"] = loss.item() * norm.tokens
        if c.entropy_coef:
            loss = loss - c.entropy_coef * agg(entropy, mb.mask)
        out["entropy"] = A.masked_sum(entropy.detach(), mb.mask).item()
        if self.reference is not None and self.objective.kl_in_loss:
            with torch.no_grad():
                ref, _ = self._forward_logprobs(self.reference, mb)
            kl = A.kl_divergence(logprobs, ref, c.kl_estimator)
            kl_loss = agg(kl, mb.mask)
            loss = loss + c.kl_coef * kl_loss
            out["kl"] = A.masked_sum(kl.detach(), mb.mask).item()
            out["kl_loss"] = kl_loss.item() * norm.tokens
        elif mb.kl is not None:
            out["kl"] = A.masked_sum(mb.kl, mb.mask).item()
        self.engine.backward(loss, scale_wrt_gas=False)
        if self.critic is not None:
            values = self._critic_values(mb)
            vloss = agg(A.value_loss_tokens(values, mb.old_values, mb.returns, clip=c.value_clip), mb.mask)
            self.critic.backward(c.value_coef * vloss, scale_wrt_gas=False)
            out["value_loss"] = vloss.item() * norm.tokens
        return out

    def _policy_terms(self, mb: MicroBatch, logprobs: torch.Tensor, agg, first_pass: bool):
        """The aggregated policy loss (ratio to pi_old, clipped; times the truncated importance weight when
        isCap is set) and its token-weighted stats: the clip fraction, and in the first pass the rollout /
        learner mismatch and the importance weights."""
        c, old, rollout = self.config, mb.old_logprobs, mb.rollout_logprobs
        per_token, _ = self.objective.policy_loss(logprobs, old, mb.advantages, mb.mask, clip_low=c.clip_ratio,
                                                  clip_high=c.clip_ratio_high)
        out: dict[str, float] = {}
        if c.is_cap is not None:
            weight, truncated = L.truncated_is_weight(old, rollout, c.is_cap)
            per_token = per_token * weight
            if first_pass:
                out["is_weight_mean"] = A.masked_sum(weight, mb.mask).item()
                out["is_truncated_fraction"] = A.masked_sum(truncated, mb.mask).item()
        # The ratio to the policy that sampled: the sampler's log-probs when the batch has them, else pi_old.
        clipped = self.objective.outside_clip(logprobs, rollout if rollout is not None else old, mb.mask,
                                              clip_low=c.clip_ratio, clip_high=c.clip_ratio_high)
        out["clip_fraction"] = A.masked_sum(clipped, mb.mask).item()
        if rollout is not None and first_pass:
            # Before any update: rollout engine minus learner, on the same tokens and weights.
            diff = rollout - old
            out["logprob_diff"] = A.masked_sum(diff, mb.mask).item()
            out["logprob_abs_diff"] = A.masked_sum(diff.abs(), mb.mask).item()
        return agg(per_token, mb.mask), out
