"""`python -m rlscale.operator [--namespace NS ...] [--metrics-port N]`."""

from __future__ import annotations

import argparse
import sys

from rlscale.metrics_names import OPERATOR_METRICS_PORT

from .main import run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlscale.operator", description=run.__doc__)
    ap.add_argument("--namespace", "-n", action="append", default=[],
                    help="watch this namespace (repeatable; default: all)")
    ap.add_argument("--metrics-port", type=int, default=OPERATOR_METRICS_PORT)
    a = ap.parse_args(argv)
    return run(namespaces=a.namespace, metrics_port=a.metrics_port)


if __name__ == "__main__":
    sys.exit(main())
