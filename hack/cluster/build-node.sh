#!/usr/bin/env bash
# Builds the real node's binaries into ~/.cache/rlscale/k8s/<k8s version>/ (RLSCALE_K8S_BIN
# overrides): kubelet, kube-proxy and CoreDNS (`build.sh node`, one `go build` with the
# control plane, see there), and kube-router, of which the node runs only the network policy
# controller (hack/cluster/realnode.py): it enforces NetworkPolicies with iptables and ipset,
# since the bridge CNI enforces none. A second run finds them there and costs seconds.
#
# kube-router is built from its own module at KUBE_ROUTER_VERSION (`go install
# module/cmd@version`: the dependency versions of that module's go.mod and go.sum, the module
# itself checked against GOSUMDB), not from go/all: it links k8s.io/client-go v0.29.
# Measured on 2 cores beside a running `make k8s` build (load average 3-5), its modules not
# yet downloaded and its packages not in GOCACHE, `/usr/bin/time -v` of the go install
# below: 245 s wall, 226 s CPU (user+sys), 0.9 GB peak RSS; with GOCACHE warm and the binary
# missing, 5 s (the link); up to date, `time bash hack/cluster/build-node.sh` 0.04 s.
#
# Why kube-router and not sigs.k8s.io/kube-network-policies (v0.8.0, tried): that one sends
# new connections to pods through an nftables `queue` rule, and this kernel has no nftables
# queue expression (`zcat /proc/config.gz`: "# CONFIG_NFT_QUEUE is not set", "# CONFIG_MODULES
# is not set", so there is nothing to load); `nft add rule inet t c queue num 100 bypass`
# fails with "Could not process rule: No such file or directory", and kube-network-policies
# v0.8.0 run on the node logs "syncing nftables rules" error="netlink receive: no such file
# or directory" and installs no rule. What kube-router uses is built in (ipset's hash types;
# the xt matches set, physdev, conntrack, mark, comment, limit, addrtype; NFLOG, REJECT), and
# bridged pod-to-pod traffic passes iptables with CONFIG_BRIDGE_NETFILTER=y.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$HERE/build.sh" node
# shellcheck source=goenv.sh
source "$HERE/goenv.sh"
RECIPE=go-install-1
want="$KUBE_ROUTER_VERSION $RECIPE"
if [[ -x "$BIN/kube-router" && -f "$BIN/.kube-router.version" && "$(cat "$BIN/.kube-router.version")" == "$want" ]]; then
  echo "kube-router up to date in $BIN"
  exit 0
fi
command -v go >/dev/null || { echo "build-node.sh: Go is needed to build kube-router" >&2; exit 1; }
echo "building kube-router $KUBE_ROUTER_VERSION into $BIN (cold: about 4 minutes on 2 cores; cached afterwards)"
start=$(date +%s)
mkdir -p "$BIN"
V=github.com/cloudnativelabs/kube-router/v2/pkg/version
# Outside any module (cd /): `go install pkg@version` ignores a go.mod around it anyway.
(cd / && CGO_ENABLED=0 GOBIN="$BIN" go install -trimpath \
   -ldflags "-s -w -X $V.Version=$KUBE_ROUTER_VERSION -X $V.BuildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
   "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION")
echo "$want" > "$BIN/.kube-router.version"
echo "built kube-router in $(( $(date +%s) - start ))s into $BIN"
