#!/usr/bin/env bash
# The wheels `make gpu-check` needs on a GPU machine that has only torch, transformers, peft and accelerate
# (docs/gpu.md, "make gpu-check"): DeepSpeed and what it and rlscale.trainer import that those do not bring.
# DeepSpeed publishes an sdist only, so its wheel is built here (no ops prebuilt: they compile on first
# use, and the checks use none, the learner runs torch's AdamW); the others are downloaded for the GPU
# machine's Python (PYVER, default 3.12) at the versions this checkout's venv runs.
#
#   bash bench/gpu_checks/wheels.sh [FOLDER]     # default bench/out/gpu-wheels (git-ignored)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-bench/out/gpu-wheels}
PY=${PY:-.venv/bin/python}
PYVER=${PYVER:-3.12}
PLATFORM=${PLATFORM:-manylinux2014_x86_64}
mkdir -p "$OUT"
version() { "$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }

# Pure Python, and three with compiled parts (pydantic-core, msgpack, ninja) for the target's Python.
PURE=(einops hjson py-cpuinfo pydantic annotated-types typing-inspection typing-extensions)
BINARY=(pydantic-core msgpack ninja)
pins() { for p in "$@"; do echo "$p==$(version "$p")"; done; }

if ! ls "$OUT"/deepspeed-*.whl >/dev/null 2>&1; then
  DS_BUILD_OPS=0 "$PY" -m pip wheel --quiet --no-deps --no-build-isolation -w "$OUT" "deepspeed==$(version deepspeed)"
fi
# shellcheck disable=SC2046
"$PY" -m pip download --quiet --no-deps --only-binary=:all: -d "$OUT" $(pins "${PURE[@]}")
# shellcheck disable=SC2046
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform "$PLATFORM" -d "$OUT" $(pins "${BINARY[@]}")
du -sh "$OUT"
ls "$OUT"
