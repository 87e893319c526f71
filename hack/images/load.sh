#!/usr/bin/env bash
# Imports the images hack/images/build.sh built into a containerd, namespace k8s.io (where
# the kubelet's CRI looks), under the names in hack/images/tags.env. An image that containerd
# already has with the same config digest (= the podman image ID) is skipped, so a warm load
# costs a few `ctr` calls. The others go over in one stream (podman save | ctr import): the
# layers trainer and rollout share are sent once, and nothing is written to disk twice.
# Usage: hack/images/load.sh SOCKET [IMAGE...]
#   SOCKET  the containerd's gRPC socket (e.g. ~/.cache/rlscale/node/containerd.sock)
#   IMAGE   names to load; default: operator, trainer and rollout from tags.env
# Env: RLSCALE_CTR (default: ctr on PATH), RLSCALE_SNAPSHOTTER (default: containerd's).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SOCK=${1:?usage: load.sh CONTAINERD_SOCKET [IMAGE...]}
shift
# shellcheck source=lib.sh
source "$HERE/lib.sh"
# shellcheck source=tags.env
source "$HERE/tags.env"
images=("$@")
((${#images[@]})) || images=("$RLSCALE_OPERATOR_IMAGE" "$RLSCALE_TRAINER_IMAGE" "$RLSCALE_ROLLOUT_IMAGE")
[[ -S $SOCK ]] || { echo "load.sh: no containerd socket at $SOCK" >&2; exit 1; }
CTR=${RLSCALE_CTR:-ctr}
c() { "$CTR" --address "$SOCK" --namespace k8s.io "$@"; }

# config_digest IMAGE: the config digest of IMAGE in the containerd, empty when absent.
config_digest() {
  local m
  m=$(c images ls "name==$1" 2>/dev/null | awk 'NR == 2 {print $3}')
  [[ -n $m ]] || return 0
  c content get "$m" | python3 -c 'import json, sys; print(json.load(sys.stdin)["config"]["digest"])'
}

# The suffix of the name that keeps an image's previous build alive during an import.
PIN=-previous-build

# collect_garbage: a synchronous garbage collection in the containerd (ctr has no command of
# its own for one; removing a name with --sync waits for the collection that follows).
collect_garbage() {
  local any
  # sed reads to the end: `head -1` exits first, and ctr's next write then dies of SIGPIPE,
  # which pipefail made this script's exit status (141; seen with 4 images in the containerd).
  any=$(c images ls -q | sed -n 1p)
  [[ -n $any ]] || return 0
  c images tag --force "$any" rlscale.local/collect-garbage:now >/dev/null \
    && c images rm --sync rlscale.local/collect-garbage:now >/dev/null
}

# unpin: drops the second names (the previous builds are then collected, unless in use).
unpin() {
  local img
  for img in "${images[@]}"; do
    if [[ -n $(c images ls -q "name==$img$PIN") ]]; then
      c images rm "$img$PIN" >/dev/null
    fi
  done
}

# One load per containerd at a time; a second waits and then finds the images there.
mkdir -p "$IMAGES_CACHE"
exec 9>"$IMAGES_CACHE/.load-$(echo "$SOCK" | sha256sum | cut -c1-12).lock"
flock 9
start=$(date +%s)
todo=()
old=()
declare -A want
for img in "${images[@]}"; do
  id=$(pod image inspect --format '{{.Id}}' "$img" 2>/dev/null) \
    || { echo "load.sh: $img is not built here; run make images (hack/images/build.sh)" >&2; exit 1; }
  want[$img]="sha256:$id"
  have=$(config_digest "$img")
  if [[ $have == "sha256:$id" ]]; then
    echo "[images] $img already in containerd ($SOCK)"
  else
    todo+=("$img")
    [[ -n $have ]] && old+=("$have")
  fi
done
if ((${#todo[@]})); then
  echo "[images] importing ${todo[*]} into $SOCK"
  snap=()
  [[ -n ${RLSCALE_SNAPSHOTTER:-} ]] && snap=(--snapshotter "$RLSCALE_SNAPSHOTTER")
  # The import moves each tag to the new image before it unpacks it, and the unpacker reuses
  # the layer snapshots it finds (the base layers the previous build shares with this one).
  # With the tag moved, nothing may reference those snapshots any more, and a garbage
  # collection between the unpacker's check and its next layer deletes them under it. A CI
  # run failed so: "failed to prepare extraction snapshot ... parent snapshot sha256:... does
  # not exist: not found" (containerd 1.6.20). So the previous build keeps a second name until
  # the import is done, and a failed import is retried once after a collection.
  for img in "${todo[@]}"; do
    if [[ -n $(c images ls -q "name==$img") ]]; then
      c images tag --force "$img" "$img$PIN" >/dev/null
    fi
  done
  for attempt in 1 2; do
    err=$(pod save --quiet --multi-image-archive --format docker-archive "${todo[@]}" \
      | c images import "${snap[@]}" - 2>&1 >/dev/null) && break
    # Anything else that races with a collection: collect now, then import again (the
    # blobs are in containerd's content store already; snapshots left complete are reused).
    ((attempt == 1)) || { echo "$err" >&2; exit 1; }
    echo "[images] import failed, collecting garbage and importing again: ${err##*$'\n'}"
    collect_garbage
  done
  unpin
  for img in "${todo[@]}"; do
    got=$(config_digest "$img")
    [[ $got == "${want[$img]}" ]] || { echo "load.sh: $img in containerd has config ${got:-none}, expected ${want[$img]}" >&2; exit 1; }
  done
  # The versions these tags pointed at before: the CRI plugin keeps each image also under its
  # ID ("sha256:<config digest>"), which held every earlier build's ~8 GB on the node. Drop
  # that name when no tag is left on the old image; containerd's GC then frees its blobs and
  # snapshots (not those a running container still uses).
  for d in "${old[@]}"; do
    tagged=$(c images ls 2>/dev/null | awk 'NR > 1 && $1 !~ /^sha256:/ {print $3}' \
      | while read -r m; do c content get "$m" 2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["config"]["digest"])' 2>/dev/null; done \
      | grep -cx "$d" || true)
    if [[ $tagged == 0 && -n $(c images ls -q "name==$d") ]]; then
      c images rm "$d" >/dev/null && echo "[images] removed the previous image $d"
    fi
  done
fi
unpin  # also what an interrupted load left
echo "[images] loaded ${#images[@]} images (${#todo[@]} imported) in $(( $(date +%s) - start )) s"
