#!/usr/bin/env bash
# Stops the control plane that up.sh started (plain python3: the package is stdlib only).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# As in up.sh: a relative --dir is the caller's folder.
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" exec python3 -P -m hack.cluster down "$@"
