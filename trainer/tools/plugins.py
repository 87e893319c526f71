"""Plug-in objects named `module:attr` (task.tools' functions, task.environment's class), imported the same
way by the driver, `rlscale validate` and the tool workers."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from rlscale.spec import PLUGINS_ENV


def import_object(name: str, field: str) -> Any:
    """`module:attr` from the working directory, PYTHONPATH or the plug-in volume ($RLSCALE_PLUGINS)."""
    module_name, _, attr = name.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    for folder in reversed([d for d in os.environ.get(PLUGINS_ENV, "").split(os.pathsep) if d]):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ValueError(f"{field}: {name!r}: module {module_name!r} cannot be imported ({type(exc).__name__}: "
                         f"{exc}); run from the directory that holds it or put it on PYTHONPATH") from exc
    obj = getattr(module, attr, None)
    if not callable(obj):
        raise ValueError(f"{field}: {name!r}: {module_name} has no callable {attr!r}")
    return obj
