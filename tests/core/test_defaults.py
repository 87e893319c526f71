"""The spec's defaults a TRL user meets: lengths, the lr's reference batch, the run's seed."""

from __future__ import annotations

import json

import pytest
import yaml

from rlscale.plan import make_plan
from rlscale.runconfig import RunConfig, load_run_config
from rlscale.spec import parse_rlrun, parse_spec
from tests.conftest import rlrun_dict
from tests.conftest import rlscale_cli as cli

BYO = {"model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"}, "task": {"dataset": "d.jsonl", "reward": "exact-match"}}


def test_a_dataset_spec_gets_trls_lengths():
    """TRL's GRPOConfig: max_completion_length 256, max_prompt_length 512."""
    s = parse_spec(BYO)
    assert (s.task.max_new_tokens, s.model.max_length) == (256, 768)
    longer = parse_spec({**BYO, "task": {**BYO["task"], "maxNewTokens": 1024}})
    assert longer.model.max_length == 1024 + 512  # the length left out fits the one given


def test_the_builtin_task_keeps_its_own_short_lengths():
    s = parse_spec({"hardware": {"accelerator": "cpu"}})
    assert (s.task.max_new_tokens, s.model.max_length) == (8, 128)
    given = parse_spec({"hardware": {"accelerator": "cpu"}, "model": {"maxLength": 32}, "task": {"maxNewTokens": 4}})
    assert (given.task.max_new_tokens, given.model.max_length) == (4, 32)


def test_filled_defaults_survive_a_round_trip():
    r = parse_rlrun(rlrun_dict({**BYO, "batch": {"prompts": 16}}))
    d = r.to_dict()["spec"]
    assert d["task"]["maxNewTokens"] == 256 and d["model"]["maxLength"] == 768
    assert d["optimizer"]["referenceBatch"] == 128
    assert parse_rlrun(yaml.safe_load(yaml.safe_dump(r.to_dict()))).spec == r.spec


@pytest.mark.parametrize("batch,ref", [
    ({"prompts": 64, "samplesPerPrompt": 8}, 512),  # a fixed batch is its own reference
    ({"minPrompts": 16, "maxPrompts": 16, "samplesPerPrompt": 4}, 64),  # fixed by its bounds
    ({"minPrompts": 8, "maxPrompts": 64}, 64),  # the planner chooses: the documented 64
])
def test_reference_batch_defaults_to_a_fixed_batch(batch, ref):
    assert parse_spec({**BYO, "batch": batch}).optimizer.reference_batch == ref


def test_a_fixed_batch_trains_at_the_lr_written():
    """A TRL user's lr 1e-6 at 64x8 once trained at 2.83e-6 (rescaled from referenceBatch 64)."""
    spec = parse_spec({**BYO, "batch": {"prompts": 64, "samplesPerPrompt": 8}, "optimizer": {"lr": 1e-6}})
    assert make_plan(spec).learning_rate == pytest.approx(1e-6, rel=1e-9)
    given = parse_spec({**BYO, "batch": {"prompts": 64, "samplesPerPrompt": 8},
                        "optimizer": {"lr": 1e-6, "referenceBatch": 64}})
    assert make_plan(given).learning_rate == pytest.approx(1e-6 * 8 ** 0.5, rel=1e-9)


def test_validate_prints_the_lr_the_rule_trains_with(tmp_path):
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"prompt": f"{a}+1=", "answer": a + 1}) + "\n"
                                              for a in range(10)))

    def said(spec: dict) -> str:
        f = tmp_path / "s.yaml"
        f.write_text(yaml.safe_dump(rlrun_dict(spec)))
        r = cli("validate", str(f), cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    # Only a model, a dataset and a reward: it validates, with TRL's lengths and the planner's batch.
    assert "the planned batch trains at it scaled by the sqrt rule" in said(BYO)
    moved = said({**BYO, "batch": {"prompts": 64}, "optimizer": {"lr": 1e-6, "referenceBatch": 64}})
    assert "lr 1.00e-06 at optimizer.referenceBatch 64 trains at 2.83e-06 on this spec's 512 samples" in moved
    assert "lr " not in said({**BYO, "batch": {"prompts": 64}, "optimizer": {"lr": 1e-6}}).split("\n", 1)[1]
    assert "lr " not in said({**BYO, "optimizer": {"scaling": "none"}}).split("\n", 1)[1]


def test_the_run_seed_comes_from_the_spec_unless_given(tmp_path):
    r = parse_rlrun(rlrun_dict({"hardware": {"accelerator": "cpu"}, "seed": 7}))
    plan = make_plan(r.spec)
    assert RunConfig.from_rlrun(r, plan).seed == 7  # what the operator writes: the spec's seed
    assert RunConfig.from_rlrun(r, plan, seed=2).seed == 2  # rlscale run --seed 2
    assert load_run_config(RunConfig.from_rlrun(r, plan).save(tmp_path / "run.json")).seed == 7
    assert parse_spec({"hardware": {"accelerator": "cpu"}}).seed == 0
