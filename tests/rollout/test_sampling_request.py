"""A rollout request carries rollout.topK, minP and repetitionPenalty to its replica's engine call."""

from __future__ import annotations

import dataclasses

from rlscale.rollout.serve import GenerateRequest


def test_a_request_carries_the_knobs_and_requests_that_differ_run_apart():
    plain = GenerateRequest([[1, 2]], [3], samples_per_prompt=2)
    # The client sends a request as a dict; the replica rebuilds it (RolloutReplica.generate).
    knobbed = GenerateRequest(**{**dataclasses.asdict(plain), "top_k": 5, "repetition_penalty": 1.2})
    assert (knobbed.top_k, knobbed.min_p, knobbed.repetition_penalty) == (5, None, 1.2)
    # One engine call takes one SamplingParams: requests with other knobs are not merged with these.
    assert plain.sampling_key() != knobbed.sampling_key()
    assert plain.sampling_key() == GenerateRequest(**dataclasses.asdict(plain)).sampling_key()
