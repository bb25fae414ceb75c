#!/usr/bin/env bash
# The test command: installs the Debian packages, builds everything and runs every test, against
# Debian 12's LibTorch 1.13 here and then Debian 13's LibTorch 2.x in a cached chroot
# (scripts/test-libtorch2.sh). PIPETRAIN_LIBTORCH2=0 runs the first suite only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
start=$SECONDS
LIBTORCH2=${PIPETRAIN_LIBTORCH2:-1}
# The chroot is made (a download and an install: little CPU) while the first suite builds and runs.
prepare_log=$(mktemp)
prepare_pid=""
if [ "$LIBTORCH2" != 0 ]; then
  bash scripts/test-libtorch2.sh --prepare >"$prepare_log" 2>&1 &
  prepare_pid=$!
fi
# Waits for the chroot's setup and prints its log (with `quiet`, only waits: a failed first suite's
# output stays the end of the log). Whatever ends this script, the setup is not left running.
finish_prepare() {
  local rc=0
  if [ -n "$prepare_pid" ]; then
    wait "$prepare_pid" || rc=$?
    prepare_pid=""
    if [ "${1:-}" != quiet ]; then
      cat "$prepare_log"
      echo "pipetrain: the Debian 13 chroot's setup ended with status $rc after $((SECONDS - start)) s"
    fi
  fi
  rm -f "$prepare_log"
  return $rc
}
trap 'finish_prepare quiet || true' EXIT

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
echo "pipetrain: the LibTorch 1.13 suite passed after $((SECONDS - start)) s"
if [ "$LIBTORCH2" != 0 ]; then
  finish_prepare verbose
  bash scripts/test-libtorch2.sh "$@"
  echo "pipetrain: both suites passed after $((SECONDS - start)) s"
fi
