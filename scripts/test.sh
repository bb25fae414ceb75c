#!/usr/bin/env bash
# The test command: installs the Debian packages, builds everything and runs every test, against
# Debian 12's LibTorch 1.13 here and then Debian 13's LibTorch 2.x in a cached chroot
# (scripts/test-libtorch2.sh). PIPETRAIN_LIBTORCH2=0 runs the first suite only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
start=$SECONDS
# The Python package is required here: a machine without it fails instead of skipping its tests.
bash scripts/build.sh -DPIPETRAIN_PYTHON=ON
BUILD_DIR=${PIPETRAIN_BUILD_DIR:-build}
echo "pipetrain: LibTorch $(dpkg-query -W -f='${Version}' libtorch-dev) build took $((SECONDS - start)) s"
# Tests that time themselves or spawn several ranks carry the RUN_SERIAL property.
# On a failure the failed tests run once more with their output, so that it ends the log (CI
# shows the tail) and says whether the failure repeats.
if ! ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" "$@"; then
  echo "pipetrain: tests failed; running the failed ones again to show their output last"
  ctest --test-dir "$BUILD_DIR" --rerun-failed --output-on-failure || true
  exit 1
fi
if [ "${PIPETRAIN_LIBTORCH2:-1}" != 0 ]; then
  bash scripts/test-libtorch2.sh "$@"
fi
