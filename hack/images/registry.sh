#!/usr/bin/env bash
# Runs a plain-http image registry in the foreground: Debian bookworm's docker-registry 2.8.2 (the
# distribution project's v2 registry), for tests/images/test_push.py and for trying
# `make push` on one machine. The package's binary is taken out of its .deb (apt-get download,
# dpkg-deb -x) into $CACHE/registry/, so nothing is installed and no service is started.
# Usage: hack/images/registry.sh ADDR DIR
#   ADDR  host:port to listen on, e.g. 127.0.0.1:5000 (plain http: keep it on loopback)
#   DIR   where the registry keeps its blobs (DIR/data) and its config (DIR/config.yml)
# Push to it with `make push REGISTRY=127.0.0.1:5000/rlscale PUSH_TLS_VERIFY=false`.
#        hack/images/registry.sh gc DIR
#   with no registry serving DIR: deletes the manifests no tag names and every blob no tagged
#   manifest references (the registry's garbage-collect --delete-untagged), so a DIR kept
#   between pushes holds the images last pushed under each tag, not every earlier build's layers.
set -euo pipefail
usage="usage: registry.sh ADDR DIR | registry.sh gc DIR"
ADDR=${1:?$usage}
DIR=${2:?$usage}
VERSION=2.8.2+ds1-1
CACHE="${RLSCALE_CACHE:-$HOME/.cache/rlscale}/registry"
bin="$CACHE/$VERSION/usr/bin/docker-registry"
if [[ ! -x $bin ]]; then
  mkdir -p "$CACHE"
  tmp=$(mktemp -d "$CACHE/.dl.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  if ! (cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "docker-registry=$VERSION" >&2); then
    echo "registry.sh: apt-get download docker-registry=$VERSION failed; run apt-get update, or check" \
         "that the mirror still serves that version (apt-cache policy docker-registry)" >&2
    exit 1
  fi
  dpkg-deb -x "$tmp"/docker-registry_*.deb "$tmp/x"
  mkdir -p "$CACHE/$VERSION/usr/bin"
  mv "$tmp/x/usr/bin/docker-registry" "$bin.tmp" && mv "$bin.tmp" "$bin"
fi
if [[ $ADDR == gc ]]; then
  [[ -f $DIR/config.yml ]] || { echo "registry.sh gc: no $DIR/config.yml: no registry ran on $DIR" >&2; exit 2; }
  # Nothing pushed yet: nothing to collect (garbage-collect fails on the missing folder).
  [[ -d $DIR/data/docker/registry/v2/repositories ]] || exit 0
  exec "$bin" garbage-collect --delete-untagged "$DIR/config.yml"
fi
mkdir -p "$DIR/data"
cat > "$DIR/config.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $DIR/data
  delete:
    enabled: true
http:
  addr: $ADDR
EOF
exec "$bin" serve "$DIR/config.yml"
