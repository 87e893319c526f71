"""Rollout batches as the driver hands them over, and their packing into padded micro-batches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlscale.trainer.tools.credit import step_token_rewards


@dataclass
class RolloutBatch:
    """Samples of one step, grouped prompt by prompt (samples_per_prompt consecutive samples each).

    response_ids include the EOS token when the sample finished; rollout_logprobs (optional)
    are the sampler's per-token logprobs as generated: the rollout/learner mismatch is reported from
    them, and spec.algorithm.isCap's importance weights need them;
    truncated (optional) marks the samples cut at the response length limit (DAPO's overlong
    filtering leaves them out of the loss); response_mask (optional, multi-turn rollouts:
    rlscale.trainer.tools) is 1 on the model's response tokens and 0 on tool and observation tokens,
    which then carry no loss, KL, entropy or advantage. turn_starts and turn_rewards (optional, together:
    spec.task.turnCredit rewardToGo) are, per sample, where each model turn starts in the response and the
    environment's reward for it (rlscale.trainer.tools.credit).
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    rewards: list[float]
    samples_per_prompt: int
    rollout_logprobs: list[list[float]] | None = None
    truncated: list[bool] | None = None
    response_mask: list[list[int]] | None = None
    turn_starts: list[list[int]] | None = None
    turn_rewards: list[list[float]] | None = None

    def __post_init__(self):
        n = len(self.prompt_ids)
        if len(self.response_ids) != n or len(self.rewards) != n:
            raise ValueError(
                f"RolloutBatch: {n} prompts, {len(self.response_ids)} responses and {len(self.rewards)} rewards; "
                "pass one of each per sample"
            )
        if n % self.samples_per_prompt:
            raise ValueError(
                f"RolloutBatch: {n} samples is not a multiple of samples_per_prompt={self.samples_per_prompt}"
            )
        if self.truncated is not None and len(self.truncated) != n:
            raise ValueError(f"RolloutBatch: {len(self.truncated)} truncated flags for {n} samples; "
                             "pass one per sample")
        if self.response_mask is not None and [len(m) for m in self.response_mask] != [
                len(r) for r in self.response_ids]:
            raise ValueError("RolloutBatch: response_mask must have one 0/1 entry per response token of every sample")
        if any(len(r) == 0 for r in self.response_ids):
            raise ValueError("RolloutBatch: an empty response; every sample needs at least one token (EOS)")
        self._check_turns()

    def _check_turns(self) -> None:
        if (self.turn_starts is None) != (self.turn_rewards is None):
            raise ValueError("RolloutBatch: turn_starts and turn_rewards go together; pass both or neither")
        if self.turn_starts is None:
            return
        if self.response_mask is None:
            raise ValueError("RolloutBatch: turn_starts need a response_mask (the turns' model tokens)")
        for i, (s, r) in enumerate(zip(self.turn_starts, self.turn_rewards, strict=True)):
            n = len(self.response_ids[i])
            if len(s) != len(r) or not s or any(b < a for a, b in zip(s, s[1:], strict=False)) or not 0 <= s[0] \
                    or s[-1] > n:
                raise ValueError(f"RolloutBatch: sample {i}'s turn_starts {s} (rewards {r}) must not fall, lie within "
                                 f"its {n} response tokens and have one reward per turn")

    @classmethod
    def from_dict(cls, d: dict) -> RolloutBatch:
        """From a dict of the fields (JSON-carried batches): prompt_ids, response_ids, rewards,
        samples_per_prompt and optional rollout_logprobs and truncated."""
        unknown = set(d) - {"prompt_ids", "response_ids", "rewards", "samples_per_prompt", "rollout_logprobs",
                            "truncated", "response_mask", "turn_starts", "turn_rewards"}
        if unknown or "samples_per_prompt" not in d:
            raise ValueError(f"RolloutBatch: unknown keys {sorted(unknown)} or no samples_per_prompt in the batch "
                             "dict; use the RolloutBatch field names")
        logprobs, truncated, rmask = d.get("rollout_logprobs"), d.get("truncated"), d.get("response_mask")
        starts, turn_rewards = d.get("turn_starts"), d.get("turn_rewards")
        return cls(
            prompt_ids=[list(map(int, p)) for p in d["prompt_ids"]],
            response_ids=[list(map(int, r)) for r in d["response_ids"]],
            rewards=[float(r) for r in d["rewards"]],
            samples_per_prompt=int(d["samples_per_prompt"]),
            rollout_logprobs=[list(map(float, lp)) for lp in logprobs] if logprobs is not None else None,
            truncated=[bool(t) for t in truncated] if truncated is not None else None,
            response_mask=[list(map(int, m)) for m in rmask] if rmask is not None else None,
            turn_starts=[list(map(int, s)) for s in starts] if starts is not None else None,
            turn_rewards=[list(map(float, r)) for r in turn_rewards] if turn_rewards is not None else None,
        )

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def model_tokens(self, i: int) -> int:
        """Sample i's response tokens that the model generated (all of them without a response_mask)."""
        return len(self.response_ids[i]) if self.response_mask is None else int(sum(self.response_mask[i]))

    @property
    def num_tokens(self) -> int:
        return sum(len(p) + len(r) for p, r in zip(self.prompt_ids, self.response_ids, strict=True))


@dataclass
class MicroBatch:
    """Right-padded sequences (prompt + response) and response-aligned [B, T] views."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    logit_index: torch.Tensor  # [B, T]: position whose logits predict response token j
    response: torch.Tensor  # [B, T] response token ids
    mask: torch.Tensor  # [B, T] 1 on real response tokens
    advantages: torch.Tensor  # [B] (GRPO) or [B, T] (PPO, after preparation)
    rewards: torch.Tensor  # [B] the training rewards (the task's, plus any overlong penalty)
    num_samples: int  # samples whose tokens enter the loss
    rollout_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None  # [B, T] pi_old: the learner's, before the step's first update
    step_rewards: torch.Tensor | None = None  # [B, T] each turn's environment reward on its last model token


def micro_batches(indices: list[int], size: int, count: int) -> list[list[int]]:
    """Split indices into `count` chunks of at most `size`; trailing chunks may be empty."""
    chunks = [indices[i : i + size] for i in range(0, len(indices), size)]
    if len(chunks) > count:
        raise ValueError(f"micro_batches: {len(indices)} samples need more than {count} micro-batches of {size}")
    return chunks + [[] for _ in range(count - len(chunks))]


def mini_batch_groups(groups: list[list[int]], count: int) -> list[list[list[int]]]:
    """The trained prompt groups, in order, in `count` mini-batches of whole groups, as even as possible
    (the first len(groups) % count hold one group more); min(count, len(groups)) of them, so none is empty."""
    count = max(1, min(count, len(groups)))
    size, extra = divmod(len(groups), count)
    out, start = [], 0
    for m in range(count):
        end = start + size + (1 if m < extra else 0)
        out.append(groups[start:end])
        start = end
    return out


@dataclass(frozen=True)
class MicroPlan:
    """One rank's micro-batches (sample indices) for a step.

    `boundary`: when set, the first `boundary` micro-batches hold exactly whole prompt groups (the
    first part of the rank's groups) and the rest the other groups: the accumulated gradient at that
    boundary is a gradient of whole groups, where the noise scale takes its small-batch norm. Every
    rank has the same `boundary` and the same count (empty lists are zero-weight placeholders, see pack).
    """

    chunks: list[list[int]]
    boundary: int | None = None


def pack_by_length(samples: list[int], lengths: list[int], micro_batch: int,
                   micro_batch_tokens: int | None = None) -> list[list[int]]:
    """Samples into micro-batches of at most `micro_batch` sequences and, when set, at most
    `micro_batch_tokens` padded tokens (sequences x the longest one; a micro-batch pads only to its own
    longest sequence). Longest first, so padding is small and the first micro-batch is the largest in
    memory; a sequence longer than the budget gets a micro-batch of its own."""
    if micro_batch < 1:
        raise ValueError(f"spec.batch.microBatch: {micro_batch}; use at least 1")
    order = sorted(samples, key=lambda i: (-lengths[i], i))
    chunks: list[list[int]] = []
    for i in order:
        cur = chunks[-1] if chunks else None
        fits = cur is not None and len(cur) < micro_batch and (
            micro_batch_tokens is None or (len(cur) + 1) * lengths[cur[0]] <= micro_batch_tokens)
        if fits:
            cur.append(i)
        else:
            chunks.append([i])
    return chunks


def plan_micro_batches(groups: list[list[int]], rank: int, world_size: int, lengths: list[int], micro_batch: int,
                       micro_batch_tokens: int | None = None, split: bool = False) -> MicroPlan:
    """This rank's micro-batches. `groups` are the batch's trained prompt groups, each the list of its
    sample indices in the loss; ranks take every world_size-th group. A group may span micro-batches
    (its advantages are computed before any split, so the loss does not depend on the split).

    split: the rank's groups are cut in two parts, packed separately, so the micro-batches of the first
    part end on a group boundary (MicroPlan.boundary). Every rank's plan is computed here from the whole
    batch (every rank holds it), so the counts agree without communication.
    """
    def parts(r: int) -> list[list[int]]:
        mine = groups[r::world_size]
        cut = (len(mine) + 1) // 2 if split else len(mine)
        halves = [mine[:cut], mine[cut:]] if split else [mine]
        return [pack_by_length([i for g in h for i in g], lengths, micro_batch, micro_batch_tokens) for h in halves]

    every = [parts(r) for r in range(world_size)]
    sizes = [max(1, max(len(p[k]) for p in every)) for k in range(len(every[0]))]
    chunks: list[list[int]] = []
    for part, size in zip(every[rank], sizes, strict=True):
        chunks += part + [[] for _ in range(size - len(part))]
    return MicroPlan(chunks, sizes[0] if split else None)


def pack(batch: RolloutBatch, indices: list[int], advantages: torch.Tensor, device, pad_id: int = 0,
         rewards: torch.Tensor | None = None, in_loss: torch.Tensor | None = None) -> MicroBatch:
    """Pack samples into a micro-batch; an empty index list gives a zero-weight placeholder.

    Ranks must run the same number of backward passes (ZeRO 2/3 reduce in each), so a
    rank with fewer samples runs placeholders whose mask is all zero. `rewards` are the training
    rewards (default: the batch's); a sample whose `in_loss` is False gets an all-zero mask too.
    `advantages` are per sample [N] or per token [N, longest response] (per-turn credit).
    """
    placeholder = not indices
    rows = indices or [0]
    seqs = [batch.prompt_ids[i] + batch.response_ids[i] for i in rows]
    width = max(len(s) for s in seqs)
    resp_len = max(len(batch.response_ids[i]) for i in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    logit_index = torch.zeros((len(rows), resp_len), dtype=torch.long)
    response = torch.full((len(rows), resp_len), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), resp_len), dtype=torch.float32)
    rollout_lp = torch.zeros((len(rows), resp_len)) if batch.rollout_logprobs is not None else None
    weight = torch.tensor([0.0 if placeholder or (in_loss is not None and not in_loss[i]) else 1.0 for i in rows])
    for b, i in enumerate(rows):
        p, r = batch.prompt_ids[i], batch.response_ids[i]
        input_ids[b, : len(p) + len(r)] = torch.tensor(p + r)
        attention[b, : len(p) + len(r)] = 1
        # Padding positions point at the last real logit; the mask zeroes them.
        logit_index[b] = torch.clamp(torch.arange(resp_len) + len(p) - 1, max=len(p) + len(r) - 2)
        response[b, : len(r)] = torch.tensor(r)
        mask[b, : len(r)] = weight[b]
        if batch.response_mask is not None:  # tool and observation tokens: no loss, KL, entropy or advantage
            mask[b, : len(r)] *= torch.tensor(batch.response_mask[i], dtype=torch.float32)
        if rollout_lp is not None:
            lp = batch.rollout_logprobs[i]
            rollout_lp[b, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
    source = torch.tensor(batch.rewards, dtype=torch.float32) if rewards is None else rewards.float()
    adv = advantages[rows].float() * weight.view(-1, *([1] * (advantages.dim() - 1)))
    if adv.dim() == 2:  # per token over the whole batch's width: this micro-batch's responses
        adv = adv[:, :resp_len]
    steps = None
    if batch.turn_starts is not None:
        steps = torch.stack([step_token_rewards(batch.turn_rewards[i], batch.turn_starts[i], batch.response_mask[i],
                                                resp_len) for i in rows])
    to = lambda t: t.to(device) if t is not None else None  # noqa: E731
    return MicroBatch(
        input_ids=to(input_ids),
        attention_mask=to(attention),
        logit_index=to(logit_index),
        response=to(response),
        mask=to(mask),
        advantages=to(adv),
        rewards=to(source[rows]),
        num_samples=int(weight.sum().item()),
        rollout_logprobs=to(rollout_lp),
        step_rewards=to(steps),
    )
