#!/usr/bin/env bash
# Pushes the images hack/images/build.sh built (one variant) to a registry, under the names the
# chart's defaults use:
#   REGISTRY/operator:TAG                  (the same image serves both variants)
#   REGISTRY/trainer:TAG, REGISTRY/rollout:TAG, REGISTRY/torch:TAG            gpu
#   REGISTRY/trainer:TAG-cpu, REGISTRY/rollout:TAG-cpu, REGISTRY/torch:TAG-cpu cpu
# TAG defaults to the chart's appVersion (charts/rlscale/Chart.yaml), so the chart's defaults
# (operator.image, runImages in charts/rlscale/values.yaml) are what `push.sh ghcr.io/rlscale gpu`
# pushes. The torch image is pushed too (no pod runs it; it is the base for an image of your own
# built FROM it); its layers are the trainer's and rollout's, so it costs one manifest.
# Nothing is tagged locally: `podman push LOCAL docker://REMOTE` copies under the new name, so a
# rebuild leaves no old image behind a push tag. Log in first where the registry needs it:
#   source hack/images/lib.sh; pod login HOST   (or REGISTRY_AUTH_FILE=<auth.json>)
# Usage: hack/images/push.sh REGISTRY [cpu|gpu] [TAG]
#   REGISTRY  host[:port]/path, e.g. registry.example.com/ml/rlscale
# Env: RLSCALE_PUSH_TLS_VERIFY=false for a plain-http registry (e.g. one on 127.0.0.1);
#      RLSCALE_PUSH_DRY_RUN=1 prints the source and destination of each image and pushes nothing;
#      RLSCALE_PUSH_ONLY=operator[,trainer,...] pushes only those (tests/node/test_registry.py).
# At the end it prints the chart values that point a release at what it pushed.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
usage="usage: hack/images/push.sh REGISTRY [cpu|gpu] [TAG]  (make push REGISTRY=host[:port]/path VARIANT=cpu|gpu)"
REGISTRY=${1:-}
VARIANT=${2:-cpu}
TAG=${3:-}
if [[ -z $REGISTRY ]]; then
  echo "push.sh: REGISTRY is empty; name where the images go, e.g. make push REGISTRY=registry.example.com/ml/rlscale" >&2
  echo "$usage" >&2; exit 2
fi
# host[:port] then at least one path component; no scheme, no tag, no trailing slash.
if [[ ! $REGISTRY =~ ^[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+$ ]]; then
  echo "push.sh: REGISTRY is '$REGISTRY', which is not host[:port]/path (lower-case path, no scheme," \
       "no tag, no trailing slash); e.g. registry.example.com/ml/rlscale or 127.0.0.1:5000/rlscale" >&2
  exit 2
fi
case "$VARIANT" in cpu|gpu) ;; *) echo "push.sh: VARIANT must be cpu or gpu, not '$VARIANT'" >&2; exit 2 ;; esac
if [[ -z $TAG ]]; then
  TAG=$(sed -n 's/^appVersion:[[:space:]]*"\{0,1\}\([^"[:space:]]*\)"\{0,1\}[[:space:]]*$/\1/p' "$ROOT/charts/rlscale/Chart.yaml")
  [[ -n $TAG ]] || { echo "push.sh: no appVersion in charts/rlscale/Chart.yaml; pass TAG" >&2; exit 2; }
fi
if [[ ! $TAG =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,119}$ ]]; then
  echo "push.sh: TAG is '$TAG', which is not a valid image tag ([A-Za-z0-9_][A-Za-z0-9_.-]*, at most 120)" >&2
  exit 2
fi
# shellcheck source=lib.sh
source "$HERE/lib.sh"
# shellcheck source=tags.env
source "$HERE/tags.env"
suffix=""
if [[ $VARIANT == gpu ]]; then
  RLSCALE_TRAINER_IMAGE=${RLSCALE_TRAINER_IMAGE%-cpu}-gpu
  RLSCALE_ROLLOUT_IMAGE=${RLSCALE_ROLLOUT_IMAGE%-cpu}-gpu
  RLSCALE_TORCH_IMAGE=${RLSCALE_TORCH_IMAGE%-cpu}-gpu
else
  suffix=-cpu
fi
pairs=("$RLSCALE_OPERATOR_IMAGE" "$REGISTRY/operator:$TAG"
       "$RLSCALE_TORCH_IMAGE" "$REGISTRY/torch:$TAG$suffix"
       "$RLSCALE_TRAINER_IMAGE" "$REGISTRY/trainer:$TAG$suffix"
       "$RLSCALE_ROLLOUT_IMAGE" "$REGISTRY/rollout:$TAG$suffix")
only=${RLSCALE_PUSH_ONLY:-operator,torch,trainer,rollout}
for name in ${only//,/ }; do
  case "$name" in operator|torch|trainer|rollout) ;;
    *) echo "push.sh: RLSCALE_PUSH_ONLY names '$name'; the images are operator, torch, trainer, rollout" >&2; exit 2 ;;
  esac
done
tls=${RLSCALE_PUSH_TLS_VERIFY:-true}
case "$tls" in true|false) ;; *) echo "push.sh: RLSCALE_PUSH_TLS_VERIFY must be true or false, not '$tls'" >&2; exit 2 ;; esac
start=$(date +%s)
for ((i = 0; i < ${#pairs[@]}; i += 2)); do
  src=${pairs[i]} dst=${pairs[i + 1]}
  name=${dst##*/}; name=${name%%:*}
  [[ ",$only," == *",$name,"* ]] || continue
  if [[ -n ${RLSCALE_PUSH_DRY_RUN:-} ]]; then echo "$src -> $dst"; continue; fi
  pod image exists "$src" || { echo "push.sh: $src is not built; run make images VARIANT=$VARIANT first" >&2; exit 1; }
  t0=$(date +%s)
  echo "[push] $src -> $dst"
  # The blob-info cache remembers which layers the registry has, so the trainer's and rollout's
  # shared torch layers go once.
  pod push --quiet --tls-verify="$tls" "$src" "docker://$dst"
  echo "[push]   $dst: $(( $(date +%s) - t0 )) s"
done
[[ -n ${RLSCALE_PUSH_DRY_RUN:-} ]] && exit 0
echo "[push] pushed $only in $(( $(date +%s) - start )) s. Point the chart at them:"
echo "  helm upgrade --install rlscale charts/rlscale -n rlscale-system --create-namespace \\"
echo "    --set operator.image.repository=$REGISTRY/operator --set operator.image.tag=$TAG \\"
echo "    --set runImages.trainer=$REGISTRY/trainer:$TAG$suffix --set runImages.rollout=$REGISTRY/rollout:$TAG$suffix"
