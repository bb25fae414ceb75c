#!/usr/bin/env bash
# The main job: installs the Debian packages, builds, and trains the default example.
# Extra arguments go to `pipetrain train`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
BUILD_DIR=${PIPETRAIN_BUILD_DIR:-build}
"$BUILD_DIR/pipetrain" --version
exec "$BUILD_DIR/pipetrain" train "$@"
