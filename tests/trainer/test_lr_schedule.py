"""optimizer.lrSchedule: warm-up, then TRL's (transformers') linear and cosine decays, as a multiplier of the planned
lr; the spec refuses a schedule with nothing to decay, naming the field, in Python and in the CRD's CEL."""

from __future__ import annotations

import pytest

from rlscale.spec import SpecError, parse_spec
from rlscale.spec.rules import RULES
from rlscale.trainer.learner_config import LearnerConfig
from rlscale.trainer.lr_schedule import lr_factor


def transformers_lrs(name: str, warmup: int, total: int, steps: int) -> list[float]:
    """transformers' own schedule (what TRL's lr_scheduler_type picks), as the multiplier at each step."""
    import torch
    from transformers import get_scheduler

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = get_scheduler(name, opt, num_warmup_steps=warmup, num_training_steps=total)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("name", ["linear", "cosine"])
def test_after_warm_up_the_decay_is_transformers_own(name):
    warmup, total = 3, 20
    ours = [lr_factor(s, name, warmup, total) for s in range(25)]
    theirs = transformers_lrs(name, warmup, total, 25)
    assert ours[warmup:total + 1] == pytest.approx(theirs[warmup:total + 1], abs=1e-12)
    assert ours[warmup] == 1.0 and ours[total - 1] > 0 and ours[total:] == [0.0] * 5
    if name == "cosine":  # past the end transformers' cosine climbs again (a second half-cycle); rlscale's stays 0
        assert theirs[total + 4] > 0.1
    # The warm-up is rlscale's own: the first step trains at 1/warmup of the peak, transformers' at 0.
    assert ours[:warmup] == pytest.approx([1 / 3, 2 / 3, 1.0]) and theirs[0] == 0.0


def test_constant_keeps_the_existing_warm_up():
    assert [lr_factor(s, "constant", 4) for s in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    assert [lr_factor(s) for s in range(3)] == [1.0] * 3


def test_a_decay_with_no_room_is_refused_where_the_config_is_built():
    with pytest.raises(ValueError, match=r"spec.optimizer.decaySteps: 5 must exceed optimizer.warmupSteps \(5\)"):
        LearnerConfig("m", lr_schedule="cosine", warmup_steps=5, decay_steps=5)
    with pytest.raises(ValueError, match=r"spec.optimizer.lrSchedule: 'step' is not known"):
        LearnerConfig("m", lr_schedule="step")


def spec(**optimizer):
    return parse_spec({"hardware": {"accelerator": "cpu"}, "budget": {"maxSteps": 50}, "optimizer": optimizer})


def test_the_spec_carries_the_schedule_to_the_learner_with_budget_max_steps_as_the_default_end():
    s = spec(lrSchedule="cosine", warmupSteps=2)
    c = LearnerConfig.from_spec(s, "m", learning_rate=2e-5)
    assert (c.lr_schedule, c.warmup_steps, c.decay_steps, c.lr) == ("cosine", 2, 50, 2e-5)
    assert LearnerConfig.from_spec(spec(lrSchedule="linear", decaySteps=30), "m").decay_steps == 30
    assert LearnerConfig.from_spec(spec(), "m").decay_steps is None


@pytest.mark.parametrize(("optimizer", "message"), [
    ({"lrSchedule": "linear", "warmupSteps": 60}, "spec.optimizer.decaySteps: 50 (unset: budget.maxSteps) is not "
     "above optimizer.warmupSteps (60): lrSchedule linear would have nothing to decay; set decaySteps above 60"),
    ({"lrSchedule": "cosine", "warmupSteps": 10, "decaySteps": 10}, "spec.optimizer.decaySteps: 10 is not above"),
    ({"decaySteps": 10}, "spec.optimizer.decaySteps: 10 is set with lrSchedule constant, where nothing decays"),
    ({"lrSchedule": "step"}, "spec.optimizer.lrSchedule: 'step'"),
])
def test_bad_schedules_name_the_field(optimizer, message):
    with pytest.raises(SpecError) as info:
        spec(**optimizer)
    assert any(str(e).startswith(message) for e in info.value.errors), [str(e) for e in info.value.errors]


def test_the_rules_have_cel_twins():
    cel = [r.cel for r in RULES if r.path == "optimizer.decaySteps"]
    assert len(cel) == 2 and all("self.optimizer.lrSchedule" in c for c in cel)


def test_validate_says_the_schedule_back(tmp_path):
    import yaml

    from tests.conftest import rlrun_dict
    from tests.conftest import rlscale_cli as cli

    spec = {"hardware": {"accelerator": "cpu"}, "budget": {"maxSteps": 300},
            "optimizer": {"lrSchedule": "cosine", "warmupSteps": 10}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(rlrun_dict(spec)))
    r = cli("validate", "s.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert ("lr schedule cosine: the planned lr after 10 warm-up steps, down to 0 at learner step 300 "
            "(budget.maxSteps)") in " ".join(r.stdout.split())


def test_the_learner_sets_the_scheduled_lr_at_its_trained_step_count_on_policy_and_critic():
    from types import SimpleNamespace

    from rlscale.trainer.learner import Learner

    def engine():
        return SimpleNamespace(optimizer=SimpleNamespace(param_groups=[{"lr": 0.0}, {"lr": 0.0}]))

    rank = SimpleNamespace(config=LearnerConfig("m", lr_schedule="cosine", warmup_steps=2, decay_steps=10),
                           steps=6, engine=engine(), critic=engine())
    Learner._set_lr(rank, 3e-5)  # the planner's lr for this batch is the peak
    want = 3e-5 * lr_factor(6, "cosine", 2, 10)
    assert 0 < want < 3e-5
    for e in (rank.engine, rank.critic):
        assert [g["lr"] for g in e.optimizer.param_groups] == pytest.approx([want, want])
