"""Run by test_engine in its own process: vLLM caches its environment per process, so the
multiprocess engine (weights through a safetensors directory) cannot share the session's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

if __name__ == "__main__":
    from conftest import KV_CACHE_BYTES, decisive_state_dict, hf_greedy, hf_model, max_logprob_error

    from rlscale.rollout.engine import EngineConfig, RolloutEngine

    old_dir, new_dir = sys.argv[1], sys.argv[2]
    engine = RolloutEngine(EngineConfig(model=old_dir, kv_cache_bytes=KV_CACHE_BYTES, multiprocess=True))
    prompt = [1] + [4 + (i * 7) % 13 for i in range(engine.block_size + 20)]
    old = decisive_state_dict(old_dir, seed=0)
    new = decisive_state_dict(new_dir, seed=1)
    engine.load_weights(old, version=1)
    before = engine.generate([prompt, prompt], temperature=0.0, max_new_tokens=16)[0][0]
    engine.load_weights(new, version=2)
    after = engine.generate([prompt], temperature=0.0, max_new_tokens=16)[0][0]
    model = hf_model(new, new_dir)
    print("RESULT " + json.dumps({
        "before": before.token_ids,
        "after": after.token_ids,
        "version": after.weights_version,
        "expected": hf_greedy(model, prompt, 16, 2),
        "logprob_error": max_logprob_error(model, prompt, after),
    }))
    engine.close()
