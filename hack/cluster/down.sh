#!/usr/bin/env bash
# Stops the control plane that up.sh started.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec python3 "$HERE/controlplane.py" down "$@"
