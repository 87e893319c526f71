"""Rollout fixtures: small config-built models, one engine and one Ray cluster per session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S", "1.0")

# Small enough to start fast on 2 cores; head_dim 64 is what vLLM's CPU attention takes.
MODEL_SHAPE = dict(hidden_size=128, num_layers=2, num_heads=2, head_dim=64, intermediate_size=256)
KV_CACHE_BYTES = 64 * 2**20


def load_state_dict(path) -> dict:
    from safetensors.torch import load_file

    return load_file(os.path.join(path, "model.safetensors"))


def decisive_state_dict(path, seed: int) -> dict:
    """The model's weights made decisive: a random tied model only copies its last input
    token, with near-ties. A larger embedding and a +-4 final-norm gain give a greedy
    path that depends on the weights, with top-1 margins above 1 (no float near-ties),
    so exact comparisons with transformers are fair."""
    import torch

    sd = load_state_dict(path)
    g = torch.Generator().manual_seed(100 + seed)
    sd["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"] * 4
    sd["model.norm.weight"] = torch.sign(torch.randn(sd["model.norm.weight"].shape, generator=g)) * 4
    return sd


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    """Two random models of the same shape: the initial weights and an update."""
    from rlscale.trainer.modeling import save_random_model

    base = tmp_path_factory.mktemp("rollout-models")
    return (
        str(save_random_model(base / "v0", seed=0, **MODEL_SHAPE)),
        str(save_random_model(base / "v1", seed=1, **MODEL_SHAPE)),
    )


@pytest.fixture(scope="module")
def engine(model_dirs):
    """One in-process engine per module (module scope: its memory is freed for later tests)."""
    import torch

    from rlscale.rollout.engine import EngineConfig, RolloutEngine

    # vLLM's CPU worker replaces torch.set_num_threads with a no-op in its process;
    # give the rest of the test session the real one back.
    set_num_threads = torch.set_num_threads
    eng = RolloutEngine(EngineConfig(model=model_dirs[0], kv_cache_bytes=KV_CACHE_BYTES))
    yield eng
    eng.close()
    torch.set_num_threads = set_num_threads


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray for a module's tests; three `rollout` slots, as three workers would offer."""
    import ray

    assert not ray.is_initialized(), "another test left Ray running; it must shut it down"
    # address="local": always a fresh cluster, never one a neighbour (or `rlscale run`) left
    # in /tmp/ray/ray_current_cluster.
    ray.init(
        address="local", num_cpus=2, resources={"rollout": 3}, include_dashboard=False,
        log_to_driver=False,
    )
    yield ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


def hf_model(state_dict: dict, model_dir: str):
    """A transformers model of `model_dir`'s config holding `state_dict`, in float32."""

    from rlscale.trainer.modeling import load_model

    model = load_model(model_dir, dtype="float32")
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    assert not unexpected, unexpected
    # Tied embeddings: lm_head.weight is the embedding and absent from the file.
    assert set(missing) <= {"lm_head.weight"}, missing
    model.eval().requires_grad_(False)  # not the global grad switch: later tests in this process train
    return model


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos: int) -> list[int]:
    """Greedy decoding with full forward passes (no KV cache), stopping after EOS."""
    import torch

    ids = list(prompt)
    out: list[int] = []
    for _ in range(max_new_tokens):
        logits = model(torch.tensor([ids])).logits[0, -1]
        t = int(torch.argmax(logits))
        out.append(t)
        ids.append(t)
        if t == eos:
            break
    return out


def max_logprob_error(model, prompt, sample) -> float:
    """Largest |vLLM - transformers| logprob over the sample's tokens."""
    import torch

    logits = model(torch.tensor([prompt + sample.token_ids])).logits[0]
    ref = torch.log_softmax(logits.float(), dim=-1)[len(prompt) - 1 : -1]
    ref = ref.gather(1, torch.tensor(sample.token_ids)[:, None])[:, 0]
    return float((ref - torch.tensor(sample.logprobs)).abs().max())
