"""The engine's pure parts, without vLLM: seeds per prompt, and vLLM's outputs grouped per prompt."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlscale.rollout.engine import Sample, group_samples, prompt_seeds


def test_a_base_seed_gives_every_sample_its_own_stream():
    # vLLM seeds child j of a prompt with seed + j: prompts spaced by samples_per_prompt never share one.
    assert prompt_seeds(100, 3, 4) == [100, 104, 108]
    assert prompt_seeds(None, 2, 4) == [None, None]
    assert prompt_seeds([7, 9], 2, 4) == [7, 9]
    with pytest.raises(ValueError, match="2 seeds for 3 prompts"):
        prompt_seeds([7, 9], 3, 4)


def _completion(index, ids, finish="stop"):
    logprobs = [{t: SimpleNamespace(logprob=-0.5 * (k + 1))} for k, t in enumerate(ids)]
    return SimpleNamespace(index=index, token_ids=ids, logprobs=logprobs, finish_reason=finish)


def test_outputs_are_grouped_per_prompt_in_child_order():
    # Sampling: one request per prompt whose children may come back out of order.
    outputs = [SimpleNamespace(outputs=[_completion(1, [5, 2]), _completion(0, [4])]),
               SimpleNamespace(outputs=[_completion(0, [6, 6, 6], "length"), _completion(1, [2])])]
    groups = group_samples(outputs, prompts=2, copies=1, version=3)
    assert groups == [
        [Sample([4], [-0.5], "stop", 3), Sample([5, 2], [-0.5, -1.0], "stop", 3)],
        [Sample([6, 6, 6], [-0.5, -1.0, -1.5], "length", 3), Sample([2], [-0.5], "stop", 3)],
    ]


def test_greedy_copies_are_one_request_each():
    # Greedy: vLLM refuses n > 1, so a prompt's samples are `copies` requests of one child each.
    outputs = [SimpleNamespace(outputs=[_completion(0, [i])]) for i in range(4)]
    groups = group_samples(outputs, prompts=2, copies=2, version=0)
    assert [[s.token_ids for s in g] for g in groups] == [[[0], [1]], [[2], [3]]]
