#!/usr/bin/env bash
# Smoke-tests one variant's trainer and rollout images on this machine, which has no GPU: each runs
# as its own user on a read-only root with no network, and
#   1. `rlscale --help` works (the entrypoint);
#   2. its role imports: torch (the CUDA 13.0 build), vLLM, Ray Serve and the rlscale role modules,
#      DeepSpeed in the trainer (which runs the colocated engine too), rdma-core's libibverbs in the
#      GPU variant;
#   3. given the run config of a GPU spec (examples/grpo-h100.yaml, accelerator H100), the rollout
#      and learner entrypoints refuse to start, exit code 2, naming the missing GPU
#      (rlscale/gpu_preflight.py), instead of failing later inside vLLM or DeepSpeed.
# Usage: hack/images/smoke.sh [cpu|gpu]   (tests/images/test_images.py runs it for cpu)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VARIANT=${1:-cpu}
case "$VARIANT" in cpu|gpu) ;; *) echo "smoke.sh: variant must be cpu or gpu, not '$VARIANT'" >&2; exit 2 ;; esac
# shellcheck source=lib.sh
source "$HERE/lib.sh"
# shellcheck source=tags.env
source "$HERE/tags.env"
trainer=${RLSCALE_TRAINER_IMAGE%-cpu}-$VARIANT
rollout=${RLSCALE_ROLLOUT_IMAGE%-cpu}-$VARIANT
run() {  # run IMAGE ARGS...: as the image's user, read-only, a tmpfs HOME, no network
  pod run --rm --network none --read-only --tmpfs /home/rlscale:mode=1777 \
    -v "$ROOT/examples/grpo-h100.yaml:/etc/rlscale/spec.yaml:ro" "$@"
}
fail() { echo "smoke.sh: $*" >&2; exit 1; }
common="import torch, vllm, ray.serve, rlscale.rollout.serve, rlscale.rollout.entrypoint
assert torch.__version__.startswith('2.13.0') and torch.version.cuda.startswith('13.0'), (torch.__version__, torch.version.cuda)
assert vllm.__version__ == '0.32.0', vllm.__version__
assert not torch.cuda.is_available()"
ibverbs=""
[[ $VARIANT == gpu ]] && ibverbs="
import ctypes; ctypes.CDLL('libibverbs.so.1'); ctypes.CDLL('librdmacm.so.1')"
# A run config of the GPU spec (the entrypoints check the GPU before they read the plan), written
# where the container may write.
runjson="from rlscale.runconfig import RunConfig; from rlscale.spec import load_rlrun
r = load_rlrun('/etc/rlscale/spec.yaml'); RunConfig(run=r.name, spec=r.spec).save('/tmp/run.json')"
for image in "$trainer" "$rollout"; do
  pod image exists "$image" || fail "$image is not built: make images VARIANT=$VARIANT"
  t0=$(date +%s)
  out=$(run "$image" --help) || fail "$image: rlscale --help failed"
  grep -q rollout <<<"$out" || fail "$image: rlscale --help does not list the rollout command"
  check="$common$ibverbs"
  [[ $image == "$trainer" ]] && check="$check
import deepspeed, rlscale.trainer.entrypoint, rlscale.trainer.learner"
  run --entrypoint python "$image" -c "$check" >/dev/null 2>&1 \
    || { run --entrypoint python "$image" -c "$check" >&2 || true; fail "$image: the imports above failed"; }
  echo "[smoke] $image: --help and imports ok"
  role=rollout; [[ $image == "$trainer" ]] && role=learner
  set +e
  err=$(run --entrypoint sh "$image" -c "python -c \"$runjson\" && exec rlscale $role --config /tmp/run.json" 2>&1)
  rc=$?
  set -e
  [[ $rc == 2 ]] || fail "$image: rlscale $role with a GPU spec and no GPU exited $rc, not 2:"$'\n'"$err"
  grep -q "GPU preflight failed" <<<"$err" || fail "$image: its refusal does not name the GPU preflight:"$'\n'"$err"
  echo "[smoke] $image: rlscale $role refuses without a GPU (exit 2): $(grep "GPU preflight failed" <<<"$err" | tail -1 | cut -c1-200)"
  echo "[smoke] $image: $(( $(date +%s) - t0 )) s"
done
