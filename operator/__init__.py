"""Kubernetes operator (kopf) for RLRun, imported as `rlscale.operator`."""

if __name__ == "operator":
    # This folder is mapped to `rlscale.operator`, but when the repository root is on
    # sys.path (`python -m ...` run from the checkout) Python finds it first as the
    # top-level `operator` and the standard library breaks. Become the stdlib module.
    import os as _os

    _stdlib = _os.path.join(_os.path.dirname(_os.__file__), "operator.py")
    with open(_stdlib, encoding="utf-8") as _f:
        exec(compile(_f.read(), _stdlib, "exec"))
    del _os, _stdlib, _f
