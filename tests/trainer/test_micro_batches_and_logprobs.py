"""Micro-batch planning (sequence and token budgets, group-aligned noise boundary) and the chunked
log-prob/entropy computation, in-process and fast."""

from __future__ import annotations

import random

import pytest
import torch

from rlscale.trainer import logprobs as LP
from rlscale.trainer.batching import RolloutBatch, pack, pack_by_length, plan_micro_batches


def random_groups(seed: int, n_groups: int, spp: int) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    lengths = [rng.randrange(3, 60) for _ in range(n_groups * spp)]
    # some samples left out of the loss (overlong filtering): groups of unequal size
    groups = [[g * spp + j for j in range(spp) if rng.random() > 0.15] for g in range(n_groups)]
    return [g for g in groups if g], lengths


@pytest.mark.parametrize("micro_batch,tokens", [(1, None), (3, None), (32, None), (32, 80), (4, 60)])
@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("split", [False, True])
def test_plan_covers_each_sample_once_within_both_budgets(micro_batch, tokens, world_size, split):
    groups, lengths = random_groups(micro_batch + world_size, 9, 4)
    plans = [plan_micro_batches(groups, r, world_size, lengths, micro_batch, tokens, split=split)
             for r in range(world_size)]
    assert len({len(p.chunks) for p in plans}) == 1  # every rank runs as many backward passes
    assert len({p.boundary for p in plans}) == 1
    seen = []
    for rank, plan in enumerate(plans):
        mine = groups[rank::world_size]
        for chunk in plan.chunks:
            assert len(chunk) <= micro_batch
            if tokens is not None and len(chunk) > 1:  # a lone sequence may exceed the budget
                assert len(chunk) * max(lengths[i] for i in chunk) <= tokens
            seen += chunk
        if split:
            # The first `boundary` micro-batches hold exactly the rank's first groups, whole.
            first = sorted(i for c in plan.chunks[:plan.boundary] for i in c)
            cut = (len(mine) + 1) // 2
            assert first == sorted(i for g in mine[:cut] for i in g)
            assert 0 < plan.boundary < len(plan.chunks)
        else:
            assert plan.boundary is None
    assert sorted(seen) == sorted(i for g in groups for i in g)


def test_packing_sorts_by_length_so_padding_is_small():
    lengths = [5, 50, 6, 48, 7, 52, 5, 49]
    chunks = pack_by_length(list(range(8)), lengths, micro_batch=4)
    assert [sorted(lengths[i] for i in c) for c in chunks] == [[48, 49, 50, 52], [5, 5, 6, 7]]
    padded = sum(len(c) * max(lengths[i] for i in c) for c in chunks)
    assert padded <= 1.1 * sum(lengths)  # in arrival order it would be 4*52 + 4*50 = 408 for 222 tokens
    # A token budget of 100: 52 alone, 50+49, 48+7, then 6+5+5 (each within 100 padded tokens).
    chunks = pack_by_length(list(range(8)), lengths, micro_batch=8, micro_batch_tokens=100)
    assert all(len(c) * max(lengths[i] for i in c) <= 100 for c in chunks)
    assert [len(c) for c in chunks] == [1, 2, 2, 3]


def test_a_micro_batch_of_one_sequence_is_allowed_and_zero_is_refused():
    assert pack_by_length([0, 1, 2], [3, 4, 5], micro_batch=1) == [[2], [1], [0]]
    with pytest.raises(ValueError, match="microBatch"):
        pack_by_length([0], [3], micro_batch=0)


def tiny_model(vocab: int = 40):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg).double()


def tiny_batch() -> RolloutBatch:
    rng = random.Random(1)
    prompts = [[1] + [rng.randrange(3, 40) for _ in range(rng.randrange(1, 6))] for _ in range(4)]
    responses = [[rng.randrange(3, 40) for _ in range(rng.randrange(1, 9))] for _ in range(4)]
    return RolloutBatch(prompts, responses, [1.0, 0.0, 0.5, 0.2], 2)


@pytest.mark.parametrize("chunk", [1, 3, 7, 1024])
def test_chunked_logprobs_entropy_and_gradient_equal_the_full_computation(chunk):
    model = tiny_model()
    mb = pack(tiny_batch(), [0, 1, 2, 3], torch.tensor([1.0, -1.0, 0.5, -0.5]), "cpu")
    weights = torch.randn(mb.mask.shape, dtype=torch.float64)

    def run(c):
        model.zero_grad()
        logp, ent = LP.response_logprobs(model, mb, c, entropy_grad=True)
        ((logp.double() * weights + 0.1 * ent.double()) * mb.mask).sum().backward()
        return logp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    full, chunked = run(0), run(chunk)
    assert torch.allclose(chunked[0], full[0], rtol=1e-5, atol=1e-6)
    assert torch.allclose(chunked[1], full[1], rtol=1e-5, atol=1e-6)
    for name, g in full[2].items():
        assert torch.allclose(chunked[2][name], g, rtol=1e-4, atol=1e-7), name
    assert full[2]["lm_head.weight"].abs().max() > 0  # the head's gradient flows through the chunks


def test_no_logits_block_larger_than_a_chunk_is_reduced(monkeypatch):
    """The float32 reduction sees [chunk, vocab] blocks only; the model's own head runs on one position."""
    model = tiny_model(vocab=40)
    mb = pack(tiny_batch(), [0, 1, 2, 3], torch.zeros(4), "cpu")
    rows_seen, head_rows = [], []
    real = LP._reduce
    monkeypatch.setattr(LP, "_reduce", lambda logits, t: (rows_seen.append(logits.shape), real(logits, t))[1])
    model.lm_head.register_forward_hook(lambda m, i, o: head_rows.append(i[0].shape))
    logp, _ = LP.response_logprobs(model, mb, 3)
    logp.sum().backward()  # the recomputation in backward also works in chunks
    assert rows_seen and all(s[0] <= 3 and s[-1] == 40 for s in rows_seen)
    assert len(rows_seen) > 2 * (mb.mask.numel() // 3)  # forward chunks, and again in backward
    assert head_rows[0][1] == 1  # logits_to_keep=1: the model's forward made logits for one position
