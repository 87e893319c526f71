# Sourced by hack/images/*.sh: where the images live and how to reach the builder.
# The builder is podman (Debian's 4.3), rootful, with its own storage under
# ~/.cache/rlscale/containers: `podman build --volume` binds the host's uv cache into each
# RUN, so a cold build installs torch from ~/.cache/uv instead of downloading ~3 GB again
# (Docker 20.10's BuildKit can only bind the build context, stages or images).
CACHE="${RLSCALE_CACHE:-$HOME/.cache/rlscale}"
IMAGES_CACHE="$CACHE/images"
PODMAN_ROOT="${RLSCALE_PODMAN_ROOT:-$CACHE/containers/storage}"
PODMAN_RUNROOT="${RLSCALE_PODMAN_RUNROOT:-/run/rlscale-images/storage}"
# cgroupfs and file events: this machine has no systemd as PID 1 (cgroups v1). runc: crun 1.8
# failed here with "cgroups in hybrid mode not supported".
# Podman asks runc for RLIMIT_NOFILE 1048576 and RLIMIT_NPROC at least the caller's limit, but
# lowers its own NPROC hard limit to 32768 first (/proc/<podman pid>/limits), and without
# CAP_SYS_RESOURCE runc then failed: "error setting rlimit type 7" (nofile; `ulimit -Hn` is
# 20000 here) and "type 6" (nproc). The generated containers.conf asks for what can be set.
mkdir -p "$CACHE/containers"
export CONTAINERS_CONF="$CACHE/containers/containers.conf"
nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
[[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
[[ $nofile == unlimited ]] && nofile=1048576
printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n' \
  "$nofile" "$nofile" "$nproc" "$nproc" > "$CONTAINERS_CONF.tmp"
mv "$CONTAINERS_CONF.tmp" "$CONTAINERS_CONF"
pod() {
  podman --root "$PODMAN_ROOT" --runroot "$PODMAN_RUNROOT" --storage-driver overlay \
    --cgroup-manager cgroupfs --events-backend file --runtime runc "$@"
}
