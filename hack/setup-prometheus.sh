#!/usr/bin/env bash
# Puts Debian's prometheus and promtool binaries under ~/.cache/rlscale/prometheus
# (extracted from the .deb, so nothing is started as a system service). Idempotent.
set -euo pipefail
dest=${RLSCALE_CACHE:-$HOME/.cache/rlscale}/prometheus
if [ -x "$dest/prometheus" ] && [ -x "$dest/promtool" ]; then
  exit 0
fi
mkdir -p "$dest"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
if ! apt-get download prometheus >/dev/null 2>&1; then
  apt-get update -qq >/dev/null
  apt-get download prometheus >/dev/null
fi
dpkg -x prometheus_*.deb root
install -m 0755 root/usr/bin/prometheus root/usr/bin/promtool "$dest/"
echo "[setup] prometheus $("$dest/prometheus" --version 2>&1 | head -1 | awk '{print $3}') in $dest"
