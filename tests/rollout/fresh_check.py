"""Run by test_engine in its own process: an engine freshly loaded from a model directory,
as the reference for in-place updates. (A second engine in the test process would share
vLLM's process-wide parallel state, and closing it would break the session's engine.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

if __name__ == "__main__":
    from conftest import KV_CACHE_BYTES

    from rlscale.rollout.engine import EngineConfig, RolloutEngine

    model_dir, prompts = sys.argv[1], json.loads(sys.argv[2])
    engine = RolloutEngine(EngineConfig(model=model_dir, kv_cache_bytes=KV_CACHE_BYTES))
    sampled = engine.generate(prompts, samples_per_prompt=2, temperature=1.0, max_new_tokens=16, seed=7)
    greedy = engine.generate(prompts, temperature=0.0, max_new_tokens=16)
    samples = [s for g in sampled + greedy for s in g]
    print("RESULT " + json.dumps([[s.token_ids, s.logprobs] for s in samples]))
    engine.close()
