"""The embedded runner's watch loop: a Ray head that dies stops the run as a failure, not a hang."""

from __future__ import annotations

import time

from rlscale.embedded import LocalRun, RoleProcess, _watch
from rlscale.spec import load_rlrun


def test_a_dead_ray_head_stops_the_run(tmp_path, root):
    spec = load_rlrun(root / "examples" / "quickstart.yaml").spec
    local = LocalRun(cfg=None, run_dir=tmp_path)
    env = {"PATH": "/usr/bin:/bin"}
    head = local.start(RoleProcess("ray-head", ["true"], env, tmp_path / "head.log"))
    driver = local.start(RoleProcess("learner-0", ["sleep", "120"], env, tmp_path / "driver.log"))
    t0 = time.monotonic()
    code = _watch(local, driver, [], head, tmp_path, spec)
    assert code == 1 and time.monotonic() - t0 < 20
    assert not driver.alive()
