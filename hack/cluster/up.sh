#!/usr/bin/env bash
# Starts the loopback control plane (or reuses a running one) and prints the
# KUBECONFIG to use. Same code as the tests' cluster fixture: the package hack.cluster.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
bash "$HERE/build.sh" >&2
PY=python3
[[ -x "$REPO/.venv/bin/python" ]] && PY="$REPO/.venv/bin/python"
# The repository root on PYTHONPATH instead of a cd, so that a relative --dir keeps meaning
# the caller's folder; -P keeps the caller's folder itself off sys.path.
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -P -m hack.cluster up "$@"
