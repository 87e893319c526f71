# Sourced by build.sh and build-node.sh: the versions, where binaries go, and a Go that
# builds offline from the caches under ~/.cache (RLSCALE_CACHE and RLSCALE_K8S_BIN override).
# shellcheck source=versions.env
source "$HERE/versions.env"
CACHE="${RLSCALE_CACHE:-$HOME/.cache/rlscale}"
BIN="${RLSCALE_K8S_BIN:-$CACHE/k8s/$K8S_VERSION}"
export GOMODCACHE="${GOMODCACHE:-$CACHE/go/mod}"
export GOCACHE="${GOCACHE:-$HOME/.cache/go-build}"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
# The machines' Go is new enough; never let a go.mod trigger a toolchain download.
export GOTOOLCHAIN=local
