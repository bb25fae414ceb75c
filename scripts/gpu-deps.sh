#!/usr/bin/env bash
# Unpacks the Debian packages scripts/gpu-check.sh needs on a bare CUDA machine (headers and
# libraries a pip PyTorch image lacks) into .gpudeps/, here, where Debian's mirror is reachable;
# the folder then travels with the checkout (the device tool's `carry`: about 11 MiB).
# Usage: scripts/gpu-deps.sh [folder, default .gpudeps]
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=${1:-.gpudeps}
PACKAGES=(nlohmann-json3-dev libfmt-dev libcli11-dev libgtest-dev libgmock-dev librapidcheck-dev zlib1g-dev
  libgloo-dev libbenchmark-dev libbenchmark1debian)
download=$(mktemp -d)
trap 'rm -rf "$download"' EXIT
# apt-get download writes into the current directory, as the _apt user where it can.
chmod 777 "$download"
(cd "$download" && apt-get download "${PACKAGES[@]}" >/dev/null)
rm -rf "$DEPS"
mkdir -p "$DEPS"
for deb in "$download"/*.deb; do dpkg -x "$deb" "$DEPS"; done
echo "gpu-deps: ${#PACKAGES[@]} packages unpacked into $DEPS ($(du -sh "$DEPS" | cut -f1))"
