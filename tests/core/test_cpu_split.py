"""`rlscale run` generating ahead: the rollout and the learner get disjoint cores in proportion to the
plan's predicted generate and train seconds (rlscale/cpu_split.py)."""

from __future__ import annotations

from rlscale.cpu_split import split_cores


def test_cores_split_by_the_predicted_phases_each_side_at_least_one():
    s = split_cores([0, 1], 0.2, 0.25)
    assert (s.rollout, s.learner) == ([0], [1])
    s = split_cores(list(range(16)), 3.0, 1.0)
    assert (len(s.rollout), len(s.learner)) == (12, 4)
    assert not set(s.rollout) & set(s.learner) and sorted(s.rollout + s.learner) == list(range(16))
    s = split_cores([2, 3, 5], 100.0, 0.0)  # all generation still leaves the learner a core
    assert (s.rollout, s.learner) == ([2, 3], [5])
    assert split_cores([0], 1.0, 1.0) is None  # one core: nothing to split
    assert "rollout 0 (1), learner 1 (1)" in split_cores([0, 1], 0.2, 0.25).describe(0.2, 0.25)
