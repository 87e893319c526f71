#!/usr/bin/env bash
# Builds the real node's binaries from Go modules next to the control plane's, into
# ~/.cache/rlscale/k8s/<k8s version>/: kubelet and kube-proxy (k8s.io/kubernetes, wrapper
# go/node), CoreDNS (wrapper go/coredns). A second run finds them there and costs seconds.
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

stamp() { [[ -x "$BIN/$1" && -f "$BIN/.$1.version" && "$(cat "$BIN/.$1.version")" == "$2" ]]; }
mark() { echo "$2" > "$BIN/.$1.version"; }

need=()
for b in kubelet kube-proxy; do stamp "$b" "$K8S_VERSION" || need+=("$b"); done
stamp coredns "$COREDNS_VERSION" || need+=(coredns)
if [[ ${#need[@]} -eq 0 ]]; then
  echo "node binaries up to date in $BIN"
  exit 0
fi
command -v go >/dev/null || { echo "build-node.sh: Go is needed to build ${need[*]}" >&2; exit 1; }
echo "building ${need[*]} into $BIN"
start=$(date +%s)
LD="-s -w"
K8S_LD="$LD"
MINOR="${K8S_VERSION#v1.}"; MINOR="${MINOR%%.*}"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_LD="$K8S_LD -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$MINOR -X $p.gitTreeState=clean"
done
k8s_pkgs=()
for b in "${need[@]}"; do
  case "$b" in kube*) k8s_pkgs+=("k8s.io/kubernetes/cmd/$b") ;; esac
done
if [[ ${#k8s_pkgs[@]} -gt 0 ]]; then
  (cd "$HERE/go/node" && go build -trimpath -ldflags "$K8S_LD" -o "$BIN/" "${k8s_pkgs[@]}")
  for p in "${k8s_pkgs[@]}"; do mark "${p##*/}" "$K8S_VERSION"; done
fi
if [[ " ${need[*]} " == *" coredns "* ]]; then
  # coremain.GitCommit is what `coredns -version` prints after the version.
  (cd "$HERE/go/coredns" && go build -trimpath \
     -ldflags "$LD -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" -o "$BIN/coredns" .)
  mark coredns "$COREDNS_VERSION"
fi
echo "built ${need[*]} in $(( $(date +%s) - start ))s into $BIN"
