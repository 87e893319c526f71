"""Which test files a marker expression (`-m`) can select nothing from, so collection need not import them.

pytest imports a test module before `-m` deselects its tests: `make unit` (`-m "not slow and not cluster"`) paid
for importing vLLM, Ray and Kubernetes helpers in modules whose every test it then dropped. A module whose
top-level `pytestmark` carries marks M, and whose source names the markers X besides, holds tests whose marks
are M plus a subset of X; if the expression is false for every such set, none of its tests can run.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from _pytest.mark.expression import Expression

_PYTESTMARK = re.compile(r"^pytestmark\s*=\s*(.+)$", re.MULTILINE)
_MARK = re.compile(r"pytest\.mark\.([A-Za-z_]\w*)")
_NOT_MARKS = {"parametrize", "usefixtures", "filterwarnings", "skip", "skipif", "xfail"}
_MAX_OTHER = 8  # 2**8 evaluations at most; a module naming more markers is imported as usual


def module_marks(source: str) -> tuple[set[str], set[str]]:
    """(marks every test of the module has, the other markers its source names)."""
    found = _PYTESTMARK.search(source)
    every = set(_MARK.findall(found.group(1))) - _NOT_MARKS if found else set()
    return every, set(_MARK.findall(source)) - _NOT_MARKS - every


def selects_nothing(source: str, markexpr: str) -> bool:
    """True when no test of the module `source` can satisfy `markexpr`."""
    every, other = module_marks(source)
    if not markexpr or not every or len(other) > _MAX_OTHER:
        return False
    expr = Expression.compile(markexpr)
    for n in range(len(other) + 1):
        for extra in itertools.combinations(sorted(other), n):
            marks = every | set(extra)
            if expr.evaluate(lambda name, marks=marks, **_: name in marks):
                return False
    return True


def ignore_file(path: Path, markexpr: str) -> bool:
    """pytest_ignore_collect's answer for a test file under `-m markexpr`."""
    if path.suffix != ".py" or not path.name.startswith("test_") or not markexpr:
        return False
    try:
        return selects_nothing(path.read_text(), markexpr)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return False
