#!/usr/bin/env bash
# Builds the real node's binaries, kubelet, kube-proxy and CoreDNS (with only the plugins
# the local cluster's DNS uses: go/all/coredns), next to the control plane's, into
# ~/.cache/rlscale/k8s/<k8s version>/. build.sh builds them too (one `go build` for all
# binaries, see there); a second run finds them there and costs seconds.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/build.sh" node
