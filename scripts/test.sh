#!/usr/bin/env bash
# The test command: installs the Debian packages, builds everything and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
BUILD_DIR=${PIPETRAIN_BUILD_DIR:-build}
# Tests that time themselves or spawn several ranks carry the RUN_SERIAL property.
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" "$@"
