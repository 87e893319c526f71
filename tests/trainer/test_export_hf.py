"""`rlscale export RUN --hf OUT` round-trips a two-rank ZeRO-3 checkpoint, each rank on its own volume:
the exported weights are the ones the rollout engines received, and transformers and vLLM give the
same greedy outputs from the export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlscale.roles import free_port
from tests.trainer.test_checkpoint_per_rank import batch  # three groups of three, mixed rewards

pytestmark = pytest.mark.slow
WORKER = Path(__file__).with_name("export_worker.py")
PROMPTS = [[1, 5, 6, 15, 7], [1, 9, 4, 16], [1, 12, 13, 14, 15, 8], [1, 4]]


def _decisive_model(path: Path) -> Path:
    """A random model whose greedy path has top-1 margins well above float noise (a larger embedding
    and a +-4 final-norm gain), so transformers and vLLM may be compared token for token."""
    from safetensors.torch import load_file, save_file

    from rlscale.trainer.modeling import save_random_model

    save_random_model(path, hidden_size=128, num_layers=2, num_heads=2, head_dim=64, intermediate_size=256, seed=3)
    sd = load_file(path / "model.safetensors")
    g = torch.Generator().manual_seed(7)
    sd["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"] * 4
    sd["model.norm.weight"] = torch.sign(torch.randn(sd["model.norm.weight"].shape, generator=g)) * 4
    save_file(sd, path / "model.safetensors", metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two ZeRO-3 ranks, three steps, a checkpoint per rank; rank 0's published weights."""
    tmp = tmp_path_factory.mktemp("export")
    model = _decisive_model(tmp / "model")
    args = {"config": {"model_path": str(model), "zero_stage": 3, "micro_batch": 4, "lr": 1e-3},
            "root": str(tmp / "vol"), "out": str(tmp), "lr": 1e-3, "batches": [batch(i) for i in range(3)]}
    (tmp / "args.json").write_text(json.dumps(args))
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(tmp / "args.json")], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env=dict(os.environ, RANK=str(r), LOCAL_RANK="0", WORLD_SIZE="2",
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1"))
             for r in (0, 1)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]
    return tmp, model, torch.load(tmp / "published.pt")


def _export(tmp: Path, model: Path, out: Path, *rank_dirs: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rlscale.cli", "export", str(tmp / "vol" / "rank0"), "--hf", str(out),
           "--model", str(model)]
    for d in rank_dirs:
        cmd += ["--rank-dir", str(d)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def exported(trained):
    tmp, model, _ = trained
    out = tmp / "hf"
    done = _export(tmp, model, out, tmp / "vol" / "rank1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "exported step 3 (ZeRO 3" in done.stderr
    return out


def test_the_export_holds_exactly_the_weights_the_engines_received(trained, exported):
    from transformers import AutoModelForCausalLM

    _, _, published = trained
    model = AutoModelForCausalLM.from_pretrained(exported, local_files_only=True)
    mine = dict(model.named_parameters())
    assert set(published) == set(mine)
    for name, t in published.items():
        # The same float32 values copied, not recomputed: equal bit for bit.
        assert torch.equal(mine[name].detach(), t), name
    # Trained: not the model it started from.
    start = AutoModelForCausalLM.from_pretrained(trained[1], local_files_only=True)
    assert any(not torch.equal(a, b) for a, b in zip(start.parameters(), model.parameters(), strict=True))


def test_a_rank_missing_from_the_export_is_named(trained):
    tmp, model, _ = trained
    done = _export(tmp, model, tmp / "hf-partial")
    assert done.returncode == 1
    assert "--rank-dir" in done.stderr, done.stderr[-2000:]


def test_transformers_and_vllm_give_the_same_greedy_outputs_from_the_export(exported):
    from transformers import AutoModelForCausalLM

    from rlscale.rollout.engine import EngineConfig, RolloutEngine

    model = AutoModelForCausalLM.from_pretrained(exported, local_files_only=True)
    hf_out = []
    for p in PROMPTS:
        ids = model.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False, eos_token_id=None,
                             pad_token_id=0, min_new_tokens=6)
        hf_out.append(ids[0, len(p):].tolist())
    set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it in this process
    engine = RolloutEngine(EngineConfig(model=str(exported), kv_cache_bytes=64 * 2**20), warmup=False)
    try:
        groups = engine.generate(PROMPTS, max_new_tokens=6, temperature=0.0, stop_token_ids=[], ignore_eos=True)
    finally:
        engine.close()
        torch.set_num_threads = set_num_threads
    assert [g[0].token_ids for g in groups] == hf_out


@pytest.mark.parametrize("stage", [0, 1])
def test_one_rank_checkpoints_of_zero_0_and_1_export_the_published_weights(tmp_path, stage):
    from transformers import AutoModelForCausalLM

    model = _decisive_model(tmp_path / "model")
    args = {"config": {"model_path": str(model), "zero_stage": stage, "micro_batch": 4, "lr": 1e-3},
            "root": str(tmp_path / "vol"), "out": str(tmp_path), "lr": 1e-3, "batches": [batch(5)]}
    (tmp_path / "args.json").write_text(json.dumps(args))
    done = subprocess.run([sys.executable, str(WORKER), str(tmp_path / "args.json")], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
                                                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = _export(tmp_path, model, tmp_path / "hf")
    assert out.returncode == 0 and f"(ZeRO {stage}," in out.stderr, out.stderr[-2000:]
    mine = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).named_parameters())
    for name, t in torch.load(tmp_path / "published.pt").items():
        assert torch.equal(mine[name].detach(), t), name
