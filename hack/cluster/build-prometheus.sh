#!/usr/bin/env bash
# Builds the Prometheus server and promtool from their Go module (in the wrapper module
# go/all, with only the kubernetes, file and http discovery plugins: PROM_TAGS in build.sh)
# next to the control plane's binaries, into ~/.cache/rlscale/k8s/<k8s version>/. Debian's
# prometheus package is built without Kubernetes service discovery (a config with
# kubernetes_sd_configs fails with "field kubernetes_sd_configs not found in type
# config.ScrapeConfig"); the Kubernetes tests need it to find pods and endpoints the way
# the Prometheus Operator's PodMonitor and ServiceMonitor configure it. build.sh builds
# them too (one `go build` for all binaries, see there); a second run finds them there and
# costs seconds. RLSCALE_SKIP_PROMETHEUS=1 makes build.sh skip them.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/build.sh" prometheus
