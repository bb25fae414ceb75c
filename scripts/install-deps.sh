#!/usr/bin/env bash
# Installs every Debian package the build, the tests and the examples need on a fresh Debian 12.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libgloo-dev
  libopenblas0-openmp
  nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev zlib1g-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev librapidcheck-dev
  openmpi-bin libopenmpi-dev iproute2 procps shellcheck
  python3-torch python3-dev pybind11-dev python3-pytest python3-pip python3-setuptools python3-wheel
  dataset-fashion-mnist fortunes
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
