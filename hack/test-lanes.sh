#!/usr/bin/env bash
# make test TEST_LANES=2: the suite as two pytest processes side by side (tests/lanes.py says which tests go where and why):
# the local lane streams here; the k8s lane writes $LANE_DIR/k8s.log, printed whole when both are done. Each
# keeps its own -ra summary and durations. The exit status is the first failing lane's (1 when a test failed);
# a lane that PYTEST_ARGS left empty (pytest's 5, "no tests collected") counts as passed unless both are.
#   bash hack/test-lanes.sh [PYTEST_ARGS...]     PY: the interpreter (.venv/bin/python)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
LANE_DIR=${LANE_DIR:-runs/make-test}
mkdir -p "$LANE_DIR"
k8s_log="$LANE_DIR/k8s.log"
t0=$SECONDS
# SIGINT back to its default: bash starts background commands with it ignored, and pytest would then
# never see a Ctrl-C (the terminal sends it to both lanes; each tears its clusters down on it).
( trap - INT; exec "$PY" -m pytest --lane k8s "$@" >"$k8s_log" 2>&1 ) &
k8s_pid=$!
trap 'wait "$k8s_pid"; cat "$k8s_log"; exit 130' INT
trap 'kill -INT "$k8s_pid" 2>/dev/null; wait "$k8s_pid"; exit 143' TERM
echo "[make test] k8s lane (tests/operator, tests/node, tests/images) running beside this one: $k8s_log"
"$PY" -m pytest --lane local "$@"
local_rc=$?
local_s=$((SECONDS - t0))
wait "$k8s_pid"
k8s_rc=$?
trap - INT TERM
echo
echo "==================== k8s lane (pytest --lane k8s, log: $k8s_log) ===================="
cat "$k8s_log"
echo "[make test] local lane: exit $local_rc after ${local_s} s; k8s lane: exit $k8s_rc (its time: the line above);" \
     "both done after $((SECONDS - t0)) s"
if [ "$local_rc" = 5 ] && [ "$k8s_rc" = 5 ]; then exit 5; fi
for rc in "$local_rc" "$k8s_rc"; do
  if [ "$rc" != 0 ] && [ "$rc" != 5 ]; then exit "$rc"; fi
done
exit 0
