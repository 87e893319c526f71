"""tests/unit_collect.py: a file is skipped at collection only when -m can select none of its tests."""

from __future__ import annotations

from tests.conftest import ROOT
from tests.unit_collect import ignore_file, module_marks, selects_nothing

UNIT = "not slow and not cluster"


def test_a_module_marked_slow_selects_nothing_under_make_units_expression():
    src = "import pytest\npytestmark = pytest.mark.slow\n\ndef test_a():\n    pass\n"
    assert module_marks(src) == ({"slow"}, set())
    assert selects_nothing(src, UNIT)
    assert not selects_nothing(src, "slow")
    assert not selects_nothing(src, "")


def test_a_module_with_some_fast_tests_is_collected():
    src = "import pytest\n\n@pytest.mark.slow\ndef test_a():\n    pass\n\ndef test_b():\n    pass\n"
    assert not selects_nothing(src, UNIT)


def test_marks_a_test_may_add_are_tried():
    src = ("import pytest\npytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]\n\n"
           "@pytest.mark.parametrize('x', [1])\n@pytest.mark.gpu\ndef test_a(x):\n    pass\n")
    assert module_marks(src) == ({"cluster", "timeout"}, {"gpu"})
    assert selects_nothing(src, UNIT)
    assert not selects_nothing(src, "cluster and gpu")  # a test that adds gpu is selected
    assert selects_nothing(src, "cluster and not timeout")


def test_the_repositorys_unit_run_skips_only_files_it_would_deselect_whole():
    skipped = [p for p in sorted((ROOT / "tests").rglob("test_*.py")) if ignore_file(p, UNIT)]
    assert ROOT / "tests" / "rollout" / "test_transfer_parts.py" in skipped
    assert ROOT / "tests" / "core" / "test_spec.py" not in skipped
    for p in skipped:
        every, _ = module_marks(p.read_text())
        assert every & {"slow", "cluster"}, p
