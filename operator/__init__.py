"""Kubernetes operator (kopf) for RLRun, imported as `rlscale.operator`."""

if __name__ == "operator":
    # The checkout's root is ahead of the standard library on sys.path and nothing had imported
    # the stdlib's `operator` yet: `python -m pip` (or any -m) started in the checkout, whose runpy
    # imports collections, which imports operator; or the checkout on PYTHONPATH. This folder is
    # then loaded in its place, so it becomes that module: the stdlib's source runs in this
    # module's namespace (importlib.machinery needs neither collections nor operator).
    # tests/core/test_package_layout.py starts interpreters both ways.
    import os
    import sys
    from importlib.machinery import SourceFileLoader

    SourceFileLoader(__name__, os.path.join(os.path.dirname(os.__file__), "operator.py")).exec_module(
        sys.modules[__name__])
