"""Kubernetes operator (kopf) for RLRun, imported as `rlscale.operator`."""

if __name__ == "operator":
    # Python imports the standard library's `operator` while it starts, before the working
    # directory joins sys.path, so `python -m ...` in the checkout never lands here. Only an
    # interpreter started with the checkout itself on PYTHONPATH does (tests/core/test_package_layout.py).
    raise ImportError(
        "the rlscale checkout is on PYTHONPATH, so its operator/ folder (the package rlscale.operator) hides "
        "the standard library's operator module; take the checkout off PYTHONPATH: the editable install "
        "(`make venv`) already makes rlscale importable, and tests add it to sys.path themselves")
