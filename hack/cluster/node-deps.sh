#!/usr/bin/env bash
# Installs the real node's host packages (Debian): the container runtime, CNI plugins,
# nftables/iptables for kube-proxy, iptables and ipset for kube-router's NetworkPolicy
# enforcement, gcc for the pause image, busybox-static for the test image. Idempotent: a
# machine that has them all costs 9 dpkg-query calls (0.1 s).
set -euo pipefail
pkgs=(containerd runc containernetworking-plugins nftables iptables ipset gcc libc6-dev busybox-static)
missing=()
for p in "${pkgs[@]}"; do
  st="$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)"
  [[ "$st" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
command -v apt-get >/dev/null || { echo "node-deps.sh: install ${missing[*]} (needs Debian/Ubuntu apt)" >&2; exit 1; }
SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
echo "installing ${missing[*]}" >&2
$SUDO apt-get update -qq
# Where systemd runs, the package also starts a system containerd; the node runs its own.
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
