"""Each algorithm of the family runs the builtin task for a few steps (the driver's step with a real
DeepSpeed learner, HF generate as the sampler: tests/trainer/algorithm_worker.py), and its loss on a
fixed batch equals the value computed by hand below. Dynamic sampling's trained batches hold only
groups with mixed rewards, and the run's sample count includes every generated sample.

The fixed batch (algorithm_worker.fixed_batch): three groups of two samples, rewards [1, 0], [0, 1],
[1, 1], response lengths [2, 3], [1, 4], [2, 2]; the 4-token response is truncated (task.maxNewTokens
is 4). The learner's old policy is its current one, so every ratio is 1 and the policy loss is
sum_i w_i (-A_i) with w_i the aggregation's weight of sample i's tokens.

Each algorithm runs again with spec.lora (the "-lora" runs): a fresh adapter has B = 0, so the policy, and
the KL reference (the adapter off), are the base at the fixed batch's step and the hand values hold as
they are; the run must then have moved the adapter (and PPO's critic's adapter and value head) and left
the base's weights as they were.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

WORKER = Path(__file__).with_name("algorithm_worker.py")
STEPS = 3
EPS = 1e-6  # GRPO's std epsilon (rlscale.trainer.algorithms.grpo_advantages)
# A group [x, y] with x != y: mean-centred +-|x - y|/2 over its unbiased std |x - y|/sqrt(2), so +-1/sqrt(2)
# (up to EPS).


def grpo_a(diff: float) -> float:
    return (diff / 2) / (diff / math.sqrt(2) + EPS)


A = grpo_a(1.0)
# reinforce++ (every group kept, no KL at the first step since the reference is the policy): every
# token carries its sequence's reward, 10 of the 14 tokens a 1: whitened, a 1 becomes
# (1 - p)/sqrt(p(1 - p)) = sqrt(0.4) and a 0 becomes -sqrt(2.5), p = 10/14.
RPP_HI, RPP_LO = math.sqrt(0.4), -math.sqrt(2.5)
# reinforce++-baseline (uniform group dropped): centred +-0.5 with lengths 2, 3, 1, 4: mu = 0.1 and
# var = (2*0.16 + 3*0.36 + 1*0.36 + 4*0.16)/10 = 0.24, so 0.4/sqrt(0.24) and -0.6/sqrt(0.24).
RPB_HI, RPB_LO = 0.4 / math.sqrt(0.24), -0.6 / math.sqrt(0.24)

BASE = {"model": {"path": "builtin:tiny-arith", "dtype": "float32"}, "hardware": {"accelerator": "cpu"},
        "task": {"maxNewTokens": 4}, "batch": {"prompts": 8, "samplesPerPrompt": 4, "microBatch": 16},
        "optimizer": {"lr": 1e-4}, "learner": {"zeroStage": 0}, "target": {"evalEvery": 1000}}

# name -> (spec.algorithm, the fixed batch's loss by hand)
RUNS = {
    # token-mean over the 10 tokens of groups 1-2: -(2A - 3A - 1A + 4A)/10 = -0.2A; the KL term is 0
    # at the first step (reference = policy) and the entropy bonus is not in the reported loss.
    "grpo": ({"name": "grpo", "klCoef": 0.01, "klEstimator": "k2", "entropyCoef": 0.001}, -0.2 * A),
    # Dr. GRPO: A = +-0.5 unnormalised; token sum over S x L_max = 4 x 4: -(1 - 1.5 - 0.5 + 2)/16
    "dr-grpo": ({"name": "grpo", "stdNormalize": False, "lossAggregation": "seq-mean-token-sum-norm"}, -1 / 16),
    # leave-one-out, k = 2: A = r_i - r_other = +-1: -(2 - 3 - 1 + 4)/10
    "rloo": ({"name": "rloo"}, -0.2),
    # seq-mean-token-mean over all 6 sequences: -(4 RPP_HI + 2 RPP_LO)/6
    "reinforce++": ({"name": "reinforce++", "klCoef": 0.01, "lossAggregation": "seq-mean-token-mean"},
                    -(4 * RPP_HI + 2 * RPP_LO) / 6),
    # seq-mean-token-mean over the 4 kept sequences: -(RPB_HI + RPB_LO + RPB_LO + RPB_HI)/4
    "reinforce++-baseline": ({"name": "reinforce++-baseline", "lossAggregation": "seq-mean-token-mean"},
                             -(2 * RPB_HI + 2 * RPB_LO) / 4),
    # sequence ratio 1: each token of sequence i carries -A_i; token-mean as GRPO: -0.2A
    "gspo": ({"name": "gspo", "clipRatio": 3e-4, "clipRatioHigh": 4e-4, "lossAggregation": "token-mean"},
             -0.2 * A),
    # GAE advantages whitened over the tokens have a token mean of 0
    "ppo": ({"name": "ppo", "valueClip": 0.5}, 0.0),
    # Penalty 0.5 x (2 - |y|)/2 past 2 tokens: rewards 1, -0.25 | 0, 0.5 | 1, 1 (uniform, dropped);
    # the truncated 4-token sample leaves the loss: tokens 2 + 3 + 1 = 6, A = +-1/sqrt(2):
    # -(2A - 3A - 1A)/6 = A/3 (the groups' differences 1.25 and 0.5 keep A at 1/sqrt(2) up to EPS).
    "dapo": ({"name": "grpo", "dynamicSampling": {"enabled": True, "maxRounds": 4},
              "maskTruncatedCompletions": True, "overlongBuffer": {"length": 2, "penaltyFactor": 0.5},
              "clipRatioHigh": 0.28}, -(2 * grpo_a(1.25) - 3 * grpo_a(1.25) - 1 * grpo_a(0.5)) / 6),
}

LORA = {"rank": 8, "alpha": 16}  # all-linear (the default), scale alpha / rank = 2 as in docs/lora.md
RUNS.update({f"{name}-lora": ({**algorithm, "lora": LORA}, loss) for name, (algorithm, loss) in list(RUNS.items())})
LORA_RUNS = [name for name in RUNS if name.endswith("-lora")]


def spec_of(algorithm: dict) -> dict:
    """spec.algorithm, with spec.lora beside it for a "-lora" run."""
    algorithm = dict(algorithm)
    lora = algorithm.pop("lora", None)
    return {**BASE, "algorithm": algorithm, **({"lora": lora} if lora else {})}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("algorithms")
    runs = [{"name": name, "steps": STEPS, "spec": spec_of(algorithm)}
            for name, (algorithm, _) in RUNS.items()]
    (tmp / "args.json").write_text(json.dumps({"workdir": str(tmp), "runs": runs}))
    env = {**os.environ, "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}
    out = subprocess.run([sys.executable, str(WORKER), str(tmp / "args.json")], capture_output=True, text=True,
                         timeout=850, env=env, cwd=tmp)
    (tmp / "worker.out").write_text(out.stdout)  # each RESULT line has its run's "seconds"
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    found = [json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    return {r["name"]: r for r in found}


@pytest.mark.parametrize("name", list(RUNS))
def test_the_loss_on_the_fixed_batch_is_the_hand_computed_one(results, name):
    r = results[name]
    assert r["fixed"]["skipped"] == 0.0
    assert r["fixed"]["loss"] == pytest.approx(RUNS[name][1], rel=1e-4, abs=1e-6), (name, r["fixed"])


@pytest.mark.parametrize("name", list(RUNS))
def test_it_runs_the_builtin_task(results, name):
    r = results[name]
    assert len(r["records"]) == STEPS
    for rec in r["records"]:
        assert rec["skipped"] or math.isfinite(rec["loss"]), rec
    # Without dynamic sampling each step generates exactly its batch: 8 prompts x 4 samples.
    if not name.startswith("dapo"):
        assert [x["batch_samples"] for x in r["records"]] == [32] * STEPS
    assert r["records"][-1]["samples"] == r["generated"]


def training_rewards(rewards: list[float], lengths: list[int]) -> list[float]:
    """The dapo run's penalty, written out: 0.5 x (2 - |y|)/2 past 2 tokens, L_max 4."""
    return [x - 0.5 * min(max(n - 2, 0) / 2, 1.0) for x, n in zip(rewards, lengths, strict=True)]


@pytest.mark.parametrize("name", ["dapo", "dapo-lora"])
def test_dynamic_sampling_trains_only_mixed_groups_and_counts_every_generated_sample(results, name):
    r = results[name]
    assert len(r["trained"]) == STEPS
    for batch in r["trained"]:
        shaped = training_rewards(batch["rewards"], batch["lengths"])
        groups = [shaped[i:i + batch["spp"]] for i in range(0, len(shaped), batch["spp"])]
        mixed = [max(g) > min(g) for g in groups]
        assert all(mixed) or not any(mixed), groups  # all mixed, or the first round handed over (skipped)
        assert len(groups) <= 8
    generated = r["generated"]
    assert r["records"][-1]["samples"] == generated >= STEPS * 32
    assert sum(x["batch_samples"] for x in r["records"]) == generated


@pytest.mark.parametrize("name", LORA_RUNS)
def test_with_lora_the_adapter_trains_and_the_base_stays(results, name):
    full, r = results[name.removesuffix("-lora")]["moved"], results[name]["moved"]
    policy = r["policy"]
    # Only the adapter trains: all-linear rank 8 is a small share of the model; the full run trains it all.
    assert full["policy"]["frozen_params"] == 0
    assert 0 < policy["trained_params"] < 0.2 * policy["frozen_params"]
    assert policy["trained"] > 0 and policy["frozen"] == 0.0, policy
    if "critic" in r:  # PPO: the critic's body has an adapter of its own and its value head trains whole
        assert 0 < r["critic"]["trained_params"] < 0.2 * r["critic"]["frozen_params"]
        assert r["critic"]["trained"] > 0 and r["critic"]["frozen"] == 0.0, r["critic"]
