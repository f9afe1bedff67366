#!/usr/bin/env bash
# Installs keel's build and run-time dependencies from Debian's packages. Idempotent: does
# nothing when everything is present. Run as root (or with sudo available).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config clang-format
      libopenblas-dev libgoogle-glog-dev libgtest-dev libgmock-dev
      libprotobuf-dev protobuf-compiler libzmq3-dev cppzmq-dev libgloo-dev
      libopenmpi-dev openmpi-bin libunwind-dev libxxhash-dev libcli11-dev fortunes iproute2
      etcd-server etcd-client libgrpc++-dev protobuf-compiler-grpc golang-etcd-server-dev libsodium-dev libssl-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
