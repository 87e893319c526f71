#!/usr/bin/env bash
# Starts the loopback control plane (or reuses a running one) and prints the
# KUBECONFIG to use. Same code as the tests' cluster fixture: controlplane.py.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$HERE/build.sh" >&2
PY=python3
[[ -x "$HERE/../../.venv/bin/python" ]] && PY="$HERE/../../.venv/bin/python"
exec "$PY" "$HERE/controlplane.py" up "$@"
