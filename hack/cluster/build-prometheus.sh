#!/usr/bin/env bash
# Builds the Prometheus server and promtool from their Go module (wrapper go/prometheus)
# next to the control plane's binaries, into ~/.cache/rlscale/k8s/<k8s version>/. Debian's
# prometheus package is built without Kubernetes service discovery (a config with
# kubernetes_sd_configs fails with "field kubernetes_sd_configs not found in type
# config.ScrapeConfig"); the Kubernetes tests need it to find pods and endpoints the way
# the Prometheus Operator's PodMonitor and ServiceMonitor configure it. A second run finds
# the binaries there and costs about nothing. RLSCALE_SKIP_PROMETHEUS=1 skips it.
# Measured on 2 cores shared with other builds (load average 11-16), modules downloaded:
# cold 813 s wall, 342 s CPU, 1.3 GB peak RSS
# (`/usr/bin/time -v env GOCACHE=$(mktemp -d) bash hack/cluster/build-prometheus.sh`); the
# server alone took 805 s wall the same way, promtool adds 11 packages and a link (21 s
# alone on a warm cache); second run 0.01 s (`time bash hack/cluster/build-prometheus.sh`).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${RLSCALE_CACHE:-$HOME/.cache/rlscale}"
BIN="${RLSCALE_K8S_BIN:-$CACHE/k8s/$K8S_VERSION}"
export GOMODCACHE="${GOMODCACHE:-$CACHE/go/mod}"
export GOCACHE="${GOCACHE:-$HOME/.cache/go-build}"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export GOTOOLCHAIN=local
mkdir -p "$BIN"

# Only the discovery plugins the tests use: kubernetes, plus file and http (no tag removes
# them) and static (built into the config). Without remove_all_sd the module
# links every cloud provider's SDK (aws, azure, gce, ...): 1518 packages instead of 1275
# (`go list -deps [-tags $TAGS] github.com/prometheus/prometheus/cmd/prometheus | wc -l` in
# go/prometheus). No builtinassets tag: the web UI is not embedded (the tests use only the
# HTTP API; /-/ready and /api/v1/query answer without it).
TAGS="remove_all_sd,enable_kubernetes_sd"

if [[ -x "$BIN/prometheus" && -x "$BIN/promtool" && -f "$BIN/.prometheus.version" \
      && "$(cat "$BIN/.prometheus.version")" == "$PROMETHEUS_VERSION $TAGS" ]]; then
  echo "prometheus and promtool up to date in $BIN"
  exit 0
fi
command -v go >/dev/null || { echo "build-prometheus.sh: Go is needed to build prometheus" >&2; exit 1; }
echo "building prometheus and promtool $PROMETHEUS_VERSION ($TAGS) into $BIN"
start=$(date +%s)
# The release build (promu) stamps these; without them `prometheus --version` prints an
# empty version. PROMETHEUS_VERSION v0.3XX.Y is release 3.XX.Y; Revision names the module
# version the sources came from (the proxy's module zip carries no commit).
REL="${PROMETHEUS_VERSION#v0.3}"; REL="3.$((10#${REL%%.*})).${REL#*.}"
V=github.com/prometheus/common/version
LD="-s -w -X $V.Version=$REL -X $V.Revision=$PROMETHEUS_VERSION -X $V.Branch=HEAD"
LD="$LD -X $V.BuildUser=$(id -un)@$(hostname) -X $V.BuildDate=$(date -u +%Y%m%d-%H:%M:%S)"
(cd "$HERE/go/prometheus" && go build -trimpath -tags "$TAGS" -ldflags "$LD" \
   -o "$BIN/" github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool)
echo "$PROMETHEUS_VERSION $TAGS" > "$BIN/.prometheus.version"
echo "built prometheus and promtool in $(( $(date +%s) - start ))s into $BIN"
