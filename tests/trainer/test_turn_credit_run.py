"""Per-turn credit in a real run (tests/trainer/turn_credit_worker.py): the driver's step with a real DeepSpeed
learner on builtin:tiny-arith, the multi-turn loop built from the spec around HF generate, and an environment
with a reward every turn (RetryEnv: +0.5 for the right sum, -0.25 and a second try for a wrong one), under
spec.task.turnCredit rewardToGo with a group algorithm (grpo, turnDiscount 0.9) and a per-token one
(reinforce++). It trains without error: the learner gets each trajectory's turns and step rewards, every
step's loss is finite, and the policy's parameters move."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WORKER = Path(__file__).with_name("turn_credit_worker.py")
STEPS = 2
BASE = {"model": {"path": "builtin:tiny-arith", "dtype": "float32"}, "hardware": {"accelerator": "cpu"},
        "task": {"maxNewTokens": 4, "maxTurns": 2, "environment": "turn_credit_worker:RetryEnv",
                 "turnCredit": "rewardToGo"},
        "batch": {"prompts": 8, "samplesPerPrompt": 4, "microBatch": 16}, "optimizer": {"lr": 1e-4},
        "learner": {"zeroStage": 0}, "target": {"evalEvery": 1000}}
RUNS = {"grpo": ({"name": "grpo"}, {"turnDiscount": 0.9}), "reinforce++": ({"name": "reinforce++"}, {})}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("turn-credit")
    runs = [{"name": name, "steps": STEPS,
             "spec": {**BASE, "algorithm": algorithm, "task": {**BASE["task"], **task}}}
            for name, (algorithm, task) in RUNS.items()]
    (tmp / "args.json").write_text(json.dumps({"workdir": str(tmp), "runs": runs}))
    env = {**os.environ, "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}
    out = subprocess.run([sys.executable, str(WORKER), str(tmp / "args.json")], capture_output=True, text=True,
                         timeout=280, env=env, cwd=tmp)
    (tmp / "worker.out").write_text(out.stdout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    found = [json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    return {r["name"]: r for r in found}


@pytest.mark.parametrize("name", list(RUNS))
def test_it_trains_on_per_turn_rewards(results, name):
    r = results[name]
    assert len(r["records"]) == len(r["trained"]) == STEPS
    for rec in r["records"]:
        assert rec["skipped"] or math.isfinite(rec["loss"]), rec
        assert 1.0 <= rec["turns"] <= 2.0
    assert not all(rec["skipped"] for rec in r["records"])
    steps = [s for batch in r["trained"] for s in batch["turn_rewards"]]
    assert all(batch["turn_starts"] is not None for batch in r["trained"])
    # Each trajectory's step rewards are RetryEnv's: -0.25 for a wrong try, 0.5 for the right one.
    assert all(x in (-0.25, 0.5) for s in steps for x in s) and {len(s) for s in steps} <= {1, 2}
    assert any(len(s) == 2 for s in steps)  # some trajectories took a second turn, with its own reward
    assert r["moved"]["trained"] > 0
