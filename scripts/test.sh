#!/usr/bin/env bash
# The test command: installs the Debian packages, builds everything and runs every test, against
# Debian 12's LibTorch 1.13 here and then Debian 13's LibTorch 2.x in a cached chroot
# (scripts/test-libtorch2.sh). PIPETRAIN_LIBTORCH2=0 runs the first suite only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
start=$SECONDS
bash scripts/build.sh
BUILD_DIR=${PIPETRAIN_BUILD_DIR:-build}
echo "pipetrain: LibTorch $(dpkg-query -W -f='${Version}' libtorch-dev) build took $((SECONDS - start)) s"
# Tests that time themselves or spawn several ranks carry the RUN_SERIAL property.
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" "$@"
if [ "${PIPETRAIN_LIBTORCH2:-1}" != 0 ]; then
  bash scripts/test-libtorch2.sh "$@"
fi
