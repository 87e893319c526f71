#!/usr/bin/env bash
# Builds the rlscale images on this machine, without a registry, idempotently:
#   1. the pinned Debian bookworm root filesystems (hack/images/base.sh, mmdebstrap), imported
#      as localhost/rlscale/base{,-dev}:<key>;
#   2. images/torch (the shared heavy layer: torch and vLLM), then images/trainer,
#      images/rollout and images/operator, with podman build; the host's ~/.cache/uv is bound into every RUN, so
#      installs come from the same cache (and the same requirements/constraints.txt) as .venv.
# The names are in hack/images/tags.env. A run whose inputs (Dockerfiles, requirements, the
# rlscale sources, these scripts) hash as the last successful one did, and whose images are
# all still there, returns at once; after a change podman's layer cache rebuilds only the
# layers below the change. Installs podman/mmdebstrap/runc from Debian when missing.
# Usage: hack/images/build.sh [cpu|gpu]   (gpu: the GPU variants, torch's and vllm's CUDA 13
#        wheels from PyPI, ~10 GB more in ~/.cache/uv; the test cluster uses cpu, the default)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
cd "$ROOT"
VARIANT=${1:-${RLSCALE_IMAGES_VARIANT:-cpu}}
case "$VARIANT" in cpu|gpu) ;; *) echo "build.sh: variant must be cpu or gpu, not '$VARIANT'" >&2; exit 2 ;; esac
# shellcheck source=lib.sh
source "$HERE/lib.sh"
# shellcheck source=tags.env
source "$HERE/tags.env"
if [[ $VARIANT == gpu ]]; then
  RLSCALE_TRAINER_IMAGE=${RLSCALE_TRAINER_IMAGE%-cpu}-gpu
  RLSCALE_ROLLOUT_IMAGE=${RLSCALE_ROLLOUT_IMAGE%-cpu}-gpu
  RLSCALE_TORCH_IMAGE=${RLSCALE_TORCH_IMAGE%-cpu}-gpu
fi
images=("$RLSCALE_OPERATOR_IMAGE" "$RLSCALE_TORCH_IMAGE" "$RLSCALE_TRAINER_IMAGE" "$RLSCALE_ROLLOUT_IMAGE")

# One build at a time (make test and a test fixture may both call this); the next one then
# finds the images up to date.
mkdir -p "$IMAGES_CACHE"
exec 9>"$IMAGES_CACHE/.build.lock"
flock 9
# Warm path: the inputs' hash and the image IDs of the last successful build.
inputs=$(git ls-files -co --exclude-standard -- images hack/images requirements pyproject.toml \
           rlscale operator trainer rollout | grep -v -e '__pycache__' -e '\.pyc$' | LC_ALL=C sort)
key=$( { echo "$VARIANT"; for f in $inputs; do [[ -f $f ]] && { echo "$f"; sha256sum < "$f"; }; done; } | sha256sum | cut -c1-16)
stamp="$IMAGES_CACHE/built-$VARIANT"
if [[ -f $stamp && "$(head -1 "$stamp")" == "$key" ]] && command -v podman >/dev/null; then
  if [[ "$(tail -n +2 "$stamp")" == "$(pod image inspect --format '{{.Id}}' "${images[@]}" 2>/dev/null)" ]]; then
    echo "[images] up to date ($VARIANT, inputs $key)"
    exit 0
  fi
fi

# Tools, from Debian, once.
need=()
command -v podman >/dev/null || need+=(podman)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v runc >/dev/null || need+=(runc)
if ((${#need[@]})); then
  echo "[images] apt-get install ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${need[@]}" \
    || { apt-get -o DPkg::Lock::Timeout=600 update -q && DEBIAN_FRONTEND=noninteractive \
         apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${need[@]}"; }
fi
# Three other builds may share this machine's two cores.
renice -n 10 $$ >/dev/null 2>&1 || true
start=$(date +%s)

# import_base NAME: the pinned rootfs tarball as localhost/rlscale/NAME:<key>; prints the tag.
import_base() {
  local tar tag
  tar=$(bash "$HERE/base.sh" "$1") || return 1
  tag="localhost/rlscale/$1:$(basename "$tar" .tar | sed "s/^$1-//")"
  if ! pod image exists "$tag"; then
    echo "[images] importing $tar as $tag" >&2
    pod import --quiet --change 'CMD ["/bin/bash"]' "$tar" "$tag" >/dev/null || return 1
  fi
  echo "$tag"
}
# (A failure inside $(...) does not stop the script by itself: say so and stop.)
BASE=$(import_base base) || { echo "build.sh: the base image failed (above)" >&2; exit 1; }
BASE_DEV=$(import_base base-dev) || { echo "build.sh: the base-dev image failed (above)" >&2; exit 1; }
# Earlier bases (another lock, another recipe): their tarballs and tags go.
for t in $(pod images --format '{{.Repository}}:{{.Tag}}' | grep -E '^localhost/rlscale/base(-dev)?:'); do
  [[ $t == "$BASE" || $t == "$BASE_DEV" ]] || pod rmi "$t" >/dev/null 2>&1 || true
done
keep1=${BASE#localhost/rlscale/}; keep2=${BASE_DEV#localhost/rlscale/}
for f in "$IMAGES_CACHE"/base/*.tar; do
  [[ $f == */"${keep1/:/-}.tar" || $f == */"${keep2/:/-}.tar" ]] || rm -f "$f"
done

build_args=(--network host --pull=never --layers --ignorefile "$HERE/containerignore"
  --build-arg UV_CACHE_DIR=/host-uv-cache -v "${UV_CACHE_DIR:-$HOME/.cache/uv}:/host-uv-cache")
mkdir -p "${UV_CACHE_DIR:-$HOME/.cache/uv}"
# The sandbox's egress proxy re-signs TLS with its own CA, which only the host's bundle knows.
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
  build_args+=(--build-arg SSL_CERT_FILE=/host-ca.crt -v /etc/ssl/certs/ca-certificates.crt:/host-ca.crt:ro)
fi
mkdir -p "$IMAGES_CACHE/logs"
b() {  # b TAG DOCKERFILE [more podman build args]; the full log goes to $IMAGES_CACHE/logs/
  local tag=$1 file=$2 t0; shift 2
  t0=$(date +%s)
  local log; log="$IMAGES_CACHE/logs/$(basename "${tag%%:*}")-${tag##*:}.log"
  echo "[images] building $tag from $file (log: $log)"
  if ! pod build "${build_args[@]}" -f "$file" -t "$tag" "$@" . > "$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "build.sh: building $tag failed; the whole log is $log" >&2
    exit 1
  fi
  echo "[images]   $tag: $(( $(date +%s) - t0 )) s, $(pod image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.2f GB", $1/1e9}')"
}
b "$RLSCALE_OPERATOR_IMAGE" images/operator/Dockerfile --build-arg BASE="$BASE"
b "$RLSCALE_TORCH_IMAGE" images/torch/Dockerfile --target "$VARIANT" --build-arg BASE="$BASE_DEV"
for role in trainer rollout; do
  tag_var="RLSCALE_${role^^}_IMAGE"
  b "${!tag_var}" "images/$role/Dockerfile" --build-arg TORCH_IMAGE="$RLSCALE_TORCH_IMAGE" --build-arg VARIANT="$VARIANT"
done
# Untagged layers of earlier builds: a rebuild after a change leaves the old ones behind.
pod image prune --force >/dev/null 2>&1 || true
{ echo "$key"; pod image inspect --format '{{.Id}}' "${images[@]}"; } > "$stamp.tmp"
mv "$stamp.tmp" "$stamp"
echo "[images] built ${images[*]} in $(( $(date +%s) - start )) s"
