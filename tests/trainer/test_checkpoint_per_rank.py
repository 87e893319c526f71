"""Two ranks whose checkpoint directories differ (one volume per learner pod) resume consistently."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlscale.roles import free_port
from rlscale.trainer import checkpoint

pytestmark = pytest.mark.slow
WORKER = Path(__file__).with_name("per_rank_ckpt_worker.py")


def batch(seed: int) -> dict:
    import random

    rng = random.Random(seed)
    prompts, responses = [], []
    for _ in range(3):
        p = [1] + [rng.randrange(4, 17) for _ in range(4)]
        for _ in range(3):
            prompts.append(p)
            responses.append([rng.randrange(4, 17) for _ in range(rng.randrange(1, 4))] + [2])
    return {"prompt_ids": prompts, "response_ids": responses, "samples_per_prompt": 3,
            "rewards": [1, 0, 0, 0, 1, 1, 0.5, 0, 1]}


def run_two_ranks(tmp_path: Path, args: dict) -> list[str]:
    path = tmp_path / f"args-{args['tag']}.json"
    path.write_text(json.dumps(args))
    port = free_port()
    procs = []
    for rank in (0, 1):
        # LOCAL_RANK 0 on both, as in pods (one rank per pod).
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(path)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]
    return outs


def test_ranks_with_their_own_checkpoint_volumes_each_keep_a_complete_checkpoint(small_model, tmp_path):
    config = {"model_path": str(small_model), "zero_stage": 1, "micro_batch": 4, "lr": 1e-3}
    common = {"config": config, "root": str(tmp_path / "vol"), "out": str(tmp_path), "lr": 1e-3,
              "batches": [batch(1), batch(2), batch(3), batch(4)]}
    outs = run_two_ranks(tmp_path, {**common, "steps": 2, "tag": "first"})
    assert all("PER_RANK True" in o for o in outs), outs[0][-2000:]
    for rank in (0, 1):
        own = tmp_path / "vol" / f"rank{rank}"
        latest = checkpoint.latest_checkpoint(own)
        assert latest is not None and latest.name == "step-00000002", f"rank {rank} has no complete checkpoint"
        assert not list(own.glob(".tmp-*")), f"rank {rank} left a partial checkpoint"
        assert (latest / "policy" / "mp_rank_00_model_states.pt").exists()
    # Resume both ranks from their own volumes and take two more steps: the weights on both
    # ranks agree, and they moved from the checkpointed ones.
    run_two_ranks(tmp_path, {**common, "steps": 2, "tag": "resumed"})
    first = torch.load(tmp_path / "params-first-rank0.pt")
    r0 = torch.load(tmp_path / "params-resumed-rank0.pt")
    r1 = torch.load(tmp_path / "params-resumed-rank1.pt")
    for name in r0:
        # Both ranks apply the same all-reduced update: equal up to float32 rounding.
        torch.testing.assert_close(r0[name], r1[name], atol=1e-6, rtol=0, msg=f"ranks differ in {name}")
    assert max((r0[n] - first[n]).abs().max().item() for n in r0) > 1e-4
    assert checkpoint.latest_checkpoint(tmp_path / "vol" / "rank1").name == "step-00000004"


def test_ranks_cut_short_between_their_renames_resume_from_the_newest_step_all_of_them_have(small_model, tmp_path):
    """A kill after rank 0 renamed its step-4 copy and before rank 1 did: rank 1 holds step 4 only
    as a partial `.tmp-` directory. Both resume from step 2 (complete on both), say which step they
    skipped, and the next save is complete on both again."""
    config = {"model_path": str(small_model), "zero_stage": 1, "micro_batch": 4, "lr": 1e-3}
    common = {"config": config, "root": str(tmp_path / "vol"), "out": str(tmp_path), "lr": 1e-3,
              "batches": [batch(1), batch(2), batch(3), batch(4)]}
    run_two_ranks(tmp_path, {**common, "steps": 2, "tag": "first"})
    run_two_ranks(tmp_path, {**common, "steps": 2, "tag": "second"})
    rank1 = tmp_path / "vol" / "rank1"
    (rank1 / "step-00000004").rename(rank1 / ".tmp-step-00000004")
    (rank1 / "latest").write_text("step-00000002\n")
    assert checkpoint.latest_checkpoint(tmp_path / "vol" / "rank0").name == "step-00000004"

    outs = run_two_ranks(tmp_path, {**common, "steps": 1, "tag": "cut"})
    assert "RESUMED_AT 2" in outs[0], outs[0][-3000:]
    assert "checkpoint steps [4] are not complete on every rank" in outs[0], outs[0][-3000:]
    for rank in (0, 1):
        own = tmp_path / "vol" / f"rank{rank}"
        assert checkpoint.latest_checkpoint(own).name == "step-00000003", f"rank {rank}"
        assert not list(own.glob(".tmp-*")), f"rank {rank} kept the partial step"

