#!/usr/bin/env bash
# Builds the control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, kwok, helm) from Go modules into
# ~/.cache/rlscale/k8s/<k8s version>/, then the real node's kubelet, kube-proxy and
# CoreDNS (build-node.sh; RLSCALE_SKIP_NODE=1 skips them) and Prometheus
# (build-prometheus.sh; RLSCALE_SKIP_PROMETHEUS=1 skips it); a second run finds them there
# and costs seconds.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${RLSCALE_CACHE:-$HOME/.cache/rlscale}"
BIN="${RLSCALE_K8S_BIN:-$CACHE/k8s/$K8S_VERSION}"
export GOMODCACHE="${GOMODCACHE:-$CACHE/go/mod}"
export GOCACHE="${GOCACHE:-$HOME/.cache/go-build}"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
# The machines' Go is new enough; never let a go.mod trigger a toolchain download.
export GOTOOLCHAIN=local
mkdir -p "$BIN"

# stamp NAME VERSION: true when BIN/NAME was built from VERSION of this recipe.
stamp() { [[ -x "$BIN/$1" && -f "$BIN/.$1.version" && "$(cat "$BIN/.$1.version")" == "$2" ]]; }
mark() { echo "$2" > "$BIN/.$1.version"; }

need=()
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  stamp "$b" "$K8S_VERSION" || need+=("$b")
done
stamp etcd "$ETCD_VERSION" || need+=(etcd)
stamp kwok "$KWOK_VERSION" || need+=(kwok)
if [[ -z "${RLSCALE_SKIP_HELM:-}" ]]; then stamp helm "$HELM_VERSION" || need+=(helm); fi
if [[ ${#need[@]} -eq 0 ]]; then
  echo "control plane binaries up to date in $BIN"
  [[ -n "${RLSCALE_SKIP_NODE:-}" ]] || bash "$HERE/build-node.sh"
  [[ -n "${RLSCALE_SKIP_PROMETHEUS:-}" ]] || exec bash "$HERE/build-prometheus.sh"
  exit 0
fi
command -v go >/dev/null || { echo "build.sh: Go is needed to build ${need[*]} (apt-get install golang or a Go >= 1.26 toolchain)" >&2; exit 1; }
echo "building ${need[*]} into $BIN (cold: about 20 minutes on 2 cores; cached afterwards)"
start=$(date +%s)

# -s -w drops symbols (smaller, faster links); -trimpath keeps the cache path out.
LD="-s -w"
K8S_LD="$LD"
MINOR="${K8S_VERSION#v1.}"; MINOR="${MINOR%%.*}"
# The release scripts stamp the version this way; without it /version says v0.0.0.
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_LD="$K8S_LD -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$MINOR -X $p.gitTreeState=clean"
done

k8s_pkgs=()
for b in "${need[@]}"; do
  case "$b" in kube-*|kubectl) k8s_pkgs+=("k8s.io/kubernetes/cmd/$b") ;; esac
done
if [[ ${#k8s_pkgs[@]} -gt 0 ]]; then
  (cd "$HERE/go/k8s" && go build -trimpath -ldflags "$K8S_LD" -o "$BIN/" "${k8s_pkgs[@]}")
  for p in "${k8s_pkgs[@]}"; do mark "${p##*/}" "$K8S_VERSION"; done
fi
if [[ " ${need[*]} " == *" etcd "* ]]; then
  (cd "$HERE/go/etcd" && go build -trimpath -ldflags "$LD" -o "$BIN/etcd" .)
  mark etcd "$ETCD_VERSION"
fi
if [[ " ${need[*]} " == *" kwok "* ]]; then
  (cd "$HERE/go/kwok" && go build -trimpath -ldflags "$LD" -o "$BIN/kwok" sigs.k8s.io/kwok/cmd/kwok)
  mark kwok "$KWOK_VERSION"
fi
if [[ " ${need[*]} " == *" helm "* ]]; then
  (cd "$HERE/go/helm" && go build -trimpath -ldflags "$LD" -o "$BIN/helm" helm.sh/helm/v3/cmd/helm)
  mark helm "$HELM_VERSION"
fi
echo "built ${need[*]} in $(( $(date +%s) - start ))s into $BIN"
[[ -n "${RLSCALE_SKIP_NODE:-}" ]] || bash "$HERE/build-node.sh"
# The tests' Prometheus with Kubernetes discovery (RLSCALE_SKIP_PROMETHEUS=1 skips it).
[[ -n "${RLSCALE_SKIP_PROMETHEUS:-}" ]] || exec bash "$HERE/build-prometheus.sh"
