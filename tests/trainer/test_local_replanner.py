"""`rlscale run`'s re-planner on a cpu host: pinned to the staleness the cores were split for, and
predicting on the host's cores (both sides of the split), not on the learner process's own affinity."""

from __future__ import annotations

from types import SimpleNamespace

from rlscale.runconfig import LocalOptions
from rlscale.spec import load_rlrun
from rlscale.trainer.run_env import LocalEnvironment
from tests.conftest import EXAMPLES


def test_a_split_run_replans_at_its_staleness_on_both_sides_cores():
    spec = load_rlrun(EXAMPLES / "quickstart.yaml").spec
    plan = SimpleNamespace(staleness=1)
    split = LocalOptions(rollout_cpus=[0, 1, 2], learner_cpus=[3])
    cfg = SimpleNamespace(spec=spec, local=split, the_plan=lambda: plan)
    src = LocalEnvironment(cfg).plan_source(cfg)
    assert (src.staleness, src.host_cores) == (1, 4)  # not the 1 core the learner process has
    cfg.local = LocalOptions()  # a synchronous start: every core, and it stays synchronous
    plan.staleness = 0
    src = LocalEnvironment(cfg).plan_source(cfg)
    assert src.staleness == 0 and src.host_cores >= 1
