"""Folders map to import packages (operator/ is rlscale.operator): the mapping must not hide the stdlib."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

CHECK = ("import operator, os, sys, sysconfig; "
         "assert os.path.dirname(operator.__file__) == sysconfig.get_path('stdlib'), operator.__file__; "
         "import rlscale.operator, rlscale.trainer, rlscale.rollout; "
         "print(rlscale.operator.__file__)")


@pytest.mark.parametrize("how", [["-c", CHECK], ["-I", "-c", CHECK]])
def test_python_started_in_the_checkout_finds_the_stdlib_operator(how):
    # The repository root is sys.path[0] here. Python imports the stdlib `operator` while it
    # starts (site), before that entry exists, so the folder never shadows it.
    r = subprocess.run([sys.executable, *how], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("operator/__init__.py")


def test_python_with_the_checkout_on_pythonpath_stops_at_once_naming_the_folder_and_the_fix():
    # PYTHONPATH puts the root on sys.path before site runs, so the folder would be found first as
    # `operator` and every stdlib module that needs it would break somewhere far from the cause.
    import os

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", "import collections"], cwd="/", env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    assert "the rlscale checkout is on PYTHONPATH" in r.stderr and "take the checkout off PYTHONPATH" in r.stderr, \
        r.stderr[-2000:]


def _module_graph() -> dict[str, set[str]]:
    """Every product module and the product modules it imports, at any depth of its code (a lazy
    import inside a function counts too: it only hides a cycle until that function runs)."""
    import ast

    folders = {"rlscale": "rlscale", "operator": "rlscale.operator", "trainer": "rlscale.trainer",
               "rollout": "rlscale.rollout"}
    files = {}
    for folder, package in folders.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            files[".".join([package, *parts])] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def test_no_product_module_imports_itself_in_a_circle():
    graph = _module_graph()
    assert "rlscale.trainer.driver" in graph and "rlscale.spec.rules" in graph
    cycles, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            cycles.append(path[path.index(node):] + [node])
            return
        if node in done:
            return
        for dep in sorted(graph[node]):
            visit(dep, [*path, node])
        done.add(node)

    for start in sorted(graph):
        visit(start, [])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
