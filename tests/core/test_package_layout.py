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


STDLIB_OPERATOR = ("import collections, functools, operator; "
                   "assert operator.itemgetter(1)([0, 7]) == 7 and operator.add(2, 3) == 5; "
                   "assert functools.reduce(operator.mul, [2, 3, 4]) == 24; print('stdlib operator ok')")


@pytest.mark.parametrize("how", [["-c", CHECK], ["-I", "-c", CHECK]])
def test_python_started_in_the_checkout_finds_the_stdlib_operator(how):
    # The repository root is sys.path[0] here. Python imports the stdlib `operator` while it
    # starts (site), before that entry exists, so the folder never shadows it.
    r = subprocess.run([sys.executable, *how], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("operator/__init__.py")


@pytest.mark.parametrize("python", [sys.executable, sys.base_prefix + "/bin/python3"], ids=["venv", "bare"])
@pytest.mark.parametrize("how", ["dash-m", "pythonpath"])
def test_the_folder_found_as_operator_behaves_as_the_stdlib_operator(python, how, tmp_path):
    # `python -m` started in the checkout (runpy imports collections, which imports operator,
    # after the root joined sys.path) and a checkout on PYTHONPATH both find the folder first:
    # a fresh clone's `python3 -m venv .venv` stopped there. The folder then runs the stdlib's
    # operator in its own namespace, and rlscale.operator is unaffected.
    import os

    (tmp_path / "probe_operator.py").write_text(STDLIB_OPERATOR)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if how == "dash-m":
        env["PYTHONPATH"] = str(tmp_path)  # after the root, which -m puts first
        args, cwd = [python, "-m", "probe_operator"], ROOT
    else:
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(tmp_path)])
        args, cwd = [python, "-m", "probe_operator"], tmp_path
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "stdlib operator ok" in r.stdout, r.stderr[-2000:]


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
