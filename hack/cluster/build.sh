#!/usr/bin/env bash
# Builds the local cluster's binaries from Go modules into ~/.cache/rlscale/k8s/<k8s version>/
# (RLSCALE_K8S_BIN overrides): the control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, kwok, helm), the real node's kubelet,
# kube-proxy and CoreDNS (RLSCALE_SKIP_NODE=1 skips them) and the tests' Prometheus and
# promtool (RLSCALE_SKIP_PROMETHEUS=1 skips them). A second run finds them there and costs
# seconds. Arguments restrict the build to groups: control-plane, node, prometheus
# (build-node.sh and build-prometheus.sh are `build.sh node` and `build.sh prometheus`), kueue
# (the operator tests' Kueue controller manager and its CRDs, and scheduler-plugins' PodGroup
# CRD; RLSCALE_SKIP_KUEUE=1 skips them).
#
# Everything but etcd comes from ONE wrapper module, go/all, in ONE `go build`: Go's MVS
# picks one version of each dependency for all of them, so a package that several binaries
# link is compiled once, and the compiles of all binaries share one parallel schedule. With
# one wrapper module per binary (the recipe before this one) the same import path was
# compiled in up to four versions: 5001 version-qualified packages for 3461 import paths,
# now 3465 (go/all's 3347 plus etcd's 118 not shared) (`go list -deps -f '{{.ImportPath}}
# {{.Module}}'` over each wrapper's binaries, union, `sort -u | wc -l`).
# Cold (empty GOCACHE, modules already downloaded), all twelve binaries, on 2 cores shared
# with another engineer's tests, `GOCACHE=<empty dir> RLSCALE_K8S_BIN=<empty dir>
# /usr/bin/time -v nice -n 19 bash hack/cluster/build.sh`: this recipe 845 s wall, 1034 s
# CPU (user+sys), 4.9 GB of GOCACHE, 1-min load average 3.6-9.2 (mean 6.0); the recipe
# before it 1912 s wall, 1523 s CPU, 6.9 GB, load 4.6-11.0 (mean 7.5). An empty module
# cache downloads 282 MB (348 module zips, 26 s here) instead of 444 MB (480, 50 s)
# (`go list -deps` of the same packages with GOMODCACHE and GOCACHE empty).
# etcd stays in its own module, go/etcd: kube-apiserver v1.37 requires etcd's client
# modules at v3.7, and etcd's server v3.6.16 must link its own api/client v3.6.16 (its
# --version comes from go.etcd.io/etcd/api/v3/version). Its other dependencies are pinned
# to go/all's versions so they come from the same compiled packages.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=goenv.sh
source "$HERE/goenv.sh"
mkdir -p "$BIN"

# The recipe's name goes into every stamp: binaries an older recipe built (other dependency
# versions) are rebuilt once with this one.
RECIPE=go-all-1
# Prometheus with only the discovery plugins the tests use: kubernetes, plus file and http
# (no tag removes them) and static (built into the config). Without remove_all_sd the
# module links every cloud provider's SDK (aws, azure, gce, ...): 1518 packages instead of
# 1275 (`go list -deps [-tags $TAGS] github.com/prometheus/prometheus/cmd/prometheus | wc -l`
# in go/all). No builtinassets tag: the web UI is not
# embedded (the tests use only the HTTP API; /-/ready and /api/v1/query answer without it).
# Only files of github.com/prometheus/prometheus carry these tags (grep -rl of the tags
# over the module cache), so passing them to the one `go build` changes no other binary.
PROM_TAGS="remove_all_sd,enable_kubernetes_sd"

# version NAME: what NAME is built from.
version() {
  case "$1" in
    etcd) echo "$ETCD_VERSION" ;;
    kwok) echo "$KWOK_VERSION" ;;
    helm) echo "$HELM_VERSION" ;;
    coredns) echo "$COREDNS_VERSION" ;;
    prometheus|promtool) echo "$PROMETHEUS_VERSION $PROM_TAGS" ;;
    kueue) echo "$KUEUE_VERSION with-podgroup-crd" ;;
    *) echo "$K8S_VERSION" ;;
  esac
}
# stamp NAME: true when BIN/NAME was built from its version by this recipe.
stamp() { [[ -x "$BIN/$1" && -f "$BIN/.$1.version" && "$(cat "$BIN/.$1.version")" == "$(version "$1") $RECIPE" ]]; }
mark() { echo "$(version "$1") $RECIPE" > "$BIN/.$1.version"; }

groups=("$@")
if [[ ${#groups[@]} -eq 0 ]]; then
  groups=(control-plane)
  [[ -n "${RLSCALE_SKIP_NODE:-}" ]] || groups+=(node)
  [[ -n "${RLSCALE_SKIP_PROMETHEUS:-}" ]] || groups+=(prometheus)
  [[ -n "${RLSCALE_SKIP_KUEUE:-}" ]] || groups+=(kueue)
fi
want=()
for g in "${groups[@]}"; do
  case "$g" in
    control-plane)
      want+=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok)
      [[ -n "${RLSCALE_SKIP_HELM:-}" ]] || want+=(helm) ;;
    node) want+=(kubelet kube-proxy coredns) ;;
    prometheus) want+=(prometheus promtool) ;;
    kueue) want+=(kueue) ;;
    *) echo "build.sh: unknown group '$g' (control-plane, node, prometheus, kueue)" >&2; exit 2 ;;
  esac
done
need=()
for b in "${want[@]}"; do stamp "$b" || need+=("$b"); done
if [[ ${#need[@]} -eq 0 ]]; then
  echo "${groups[*]} binaries up to date in $BIN"
  exit 0
fi
command -v go >/dev/null || { echo "build.sh: Go is needed to build ${need[*]} (apt-get install golang or a Go >= 1.26 toolchain)" >&2; exit 1; }
# The wrapper modules must build what versions.env names: go.mod and versions.env in step.
check() { # DIR MODULE VERSION
  local got; got=$(cd "$HERE/go/$1" && go list -m -f '{{.Version}}' "$2")
  [[ "$got" == "$3" ]] || { echo "build.sh: go/$1/go.mod has $2 $got, versions.env says $3" >&2; exit 1; }
}
check all k8s.io/kubernetes "$K8S_VERSION"
check all sigs.k8s.io/kwok "$KWOK_VERSION"
check all helm.sh/helm/v3 "$HELM_VERSION"
check all github.com/coredns/coredns "$COREDNS_VERSION"
check all github.com/prometheus/prometheus "$PROMETHEUS_VERSION"
check etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
check etcd go.etcd.io/etcd/api/v3 "$ETCD_VERSION"
check kueue sigs.k8s.io/kueue "$KUEUE_VERSION"
echo "building ${need[*]} into $BIN (cold: about 15 minutes on 2 cores; cached afterwards)"
start=$(date +%s)

# -s -w drops symbols (smaller, faster links); -trimpath keeps the cache path out.
LD="-s -w"
K8S_LD="$LD"
MINOR="${K8S_VERSION#v1.}"; MINOR="${MINOR%%.*}"
# The release scripts stamp the version this way; without it /version says v0.0.0.
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_LD="$K8S_LD -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$MINOR -X $p.gitTreeState=clean"
done
# coremain.GitCommit is what `coredns -version` prints after the version.
COREDNS_LD="$LD -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION"
# The release build (promu) stamps these; without them `prometheus --version` prints an
# empty version. PROMETHEUS_VERSION v0.3XX.Y is release 3.XX.Y; Revision names the module
# version the sources came from (the proxy's module zip carries no commit).
REL="${PROMETHEUS_VERSION#v0.3}"; REL="3.$((10#${REL%%.*})).${REL#*.}"
V=github.com/prometheus/common/version
PROM_LD="$LD -X $V.Version=$REL -X $V.Revision=$PROMETHEUS_VERSION -X $V.Branch=HEAD"
PROM_LD="$PROM_LD -X $V.BuildUser=$(id -un)@$(hostname) -X $V.BuildDate=$(date -u +%Y%m%d-%H:%M:%S)"

pkgs=()
for b in "${need[@]}"; do
  case "$b" in
    kube-*|kubectl|kubelet) pkgs+=("k8s.io/kubernetes/cmd/$b") ;;
    kwok) pkgs+=(sigs.k8s.io/kwok/cmd/kwok) ;;
    helm) pkgs+=(helm.sh/helm/v3/cmd/helm) ;;
    coredns) pkgs+=(rlscale.dev/hack/cluster/all/coredns) ;;
    prometheus|promtool) pkgs+=("github.com/prometheus/prometheus/cmd/$b") ;;
  esac
done
if [[ ${#pkgs[@]} -gt 0 ]]; then
  # One invocation; -ldflags PATTERN=FLAGS gives each binary its own version stamps (the
  # last matching pattern wins).
  (cd "$HERE/go/all" && go build -trimpath -tags "$PROM_TAGS" \
     -ldflags "$LD" \
     -ldflags "k8s.io/kubernetes/cmd/...=$K8S_LD" \
     -ldflags "rlscale.dev/hack/cluster/all/coredns=$COREDNS_LD" \
     -ldflags "github.com/prometheus/prometheus/cmd/...=$PROM_LD" \
     -o "$BIN/" "${pkgs[@]}")
  for b in "${need[@]}"; do [[ "$b" == etcd || "$b" == kueue ]] || mark "$b"; done
fi
# After go/all: etcd's dependencies other than etcd's own are go/all's, already compiled.
if [[ " ${need[*]} " == *" etcd "* ]]; then
  (cd "$HERE/go/etcd" && go build -trimpath -ldflags "$LD" -o "$BIN/etcd" .)
  mark etcd
fi
# Kueue: its own module (go/kueue/go.mod says why), and its CRDs from the same module version
# next to the binary, for the tests to install.
if [[ " ${need[*]} " == *" kueue "* ]]; then
  (cd "$HERE/go/kueue" && go build -trimpath -ldflags "$LD" -o "$BIN/kueue" sigs.k8s.io/kueue/cmd/kueue)
  src=$(cd "$HERE/go/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
  rm -rf "$BIN/kueue-crds" && mkdir -p "$BIN/kueue-crds"
  cp "$src"/config/components/crd/bases/*.yaml "$BIN/kueue-crds/"
  # scheduler-plugins' PodGroup CRD (Coscheduling), at the version Kueue's module requires,
  # for the tests of spec.scheduling.podGroup.
  sp=$(cd "$HERE/go/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/scheduler-plugins)
  cp "$sp"/config/crd/bases/scheduling.x-k8s.io_podgroups.yaml "$BIN/kueue-crds/../podgroup-crd.yaml"
  chmod -R u+w "$BIN/kueue-crds" "$BIN/podgroup-crd.yaml"
  mark kueue
fi
echo "built ${need[*]} in $(( $(date +%s) - start ))s into $BIN"
