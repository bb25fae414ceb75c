#!/usr/bin/env bash
# Builds pipetrain against LibTorch 2.x (Debian 13's libtorch-dev) and runs every test, inside a
# Debian 13 chroot so the host keeps its own LibTorch 1.13. The chroot is cached between runs.
#
# Usage: scripts/test-libtorch2.sh [--prepare | extra ctest arguments]
#   --prepare  only makes (or updates) the chroot and its packages, builds and tests nothing:
#              scripts/test.sh runs it while the LibTorch 1.13 suite builds and runs
# Environment:
#   PIPETRAIN_TRIXIE_ROOT   where the chroot lives (default /var/cache/pipetrain/trixie)
#   PIPETRAIN_DEBIAN_MIRROR the Debian mirror debootstrap uses (default deb.debian.org)
# Needs root (debootstrap, chroot, mounts); installs debootstrap on the host when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$(pwd)
ROOT=${PIPETRAIN_TRIXIE_ROOT:-/var/cache/pipetrain/trixie}
MIRROR=${PIPETRAIN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
PREPARE_ONLY=0
if [ "${1:-}" = --prepare ]; then
  PREPARE_ONLY=1
  shift
fi

# The packages of scripts/install-deps.sh, as Debian 13 names them.
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libgloo-dev libopenblas0-openmp
  nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev zlib1g-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev librapidcheck-dev
  openmpi-bin libopenmpi-dev iproute2 procps shellcheck
  python3-torch python3-dev pybind11-dev python3-pytest python3-pip python3-setuptools python3-wheel
  dataset-fashion-mnist fortunes
)

if ! command -v debootstrap >/dev/null; then
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends debootstrap
fi

mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do $SUDO umount -l "${mounted[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
mount_once() {  # mount_once TARGET mount-args...
  local target=$1
  shift
  if ! mountpoint -q "$target"; then
    $SUDO mount "$@" "$target"
    mounted+=("$target")
  fi
}

# A chroot whose package install did not finish is made again from scratch.
if [ ! -f "$ROOT/.pipetrain-ready" ]; then
  # Nothing of the host may be mounted inside what is deleted (a run killed before cleanup).
  # awk, not grep: under pipefail a grep that finds nothing (every fresh machine) stops the script.
  findmnt -rn -o TARGET | awk -v root="$ROOT" '$0 == root || index($0, root "/") == 1' |
    sort -r | xargs -r -n1 $SUDO umount -l
  $SUDO rm -rf "$ROOT"
  $SUDO mkdir -p "$ROOT"
  echo "pipetrain: debootstrap trixie into $ROOT"
  $SUDO debootstrap --variant=minbase trixie "$ROOT" "$MIRROR" >/dev/null
fi
# The root a mount point of its own and /sys mounted: `ip netns exec` (the two-host test)
# remounts / and /sys in its namespace.
mount_once "$ROOT" --bind "$ROOT"
mount_once "$ROOT/proc" -t proc proc
mount_once "$ROOT/sys" -t sysfs sysfs
mount_once "$ROOT/dev" --rbind /dev
$SUDO cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
if [ ! -f "$ROOT/.pipetrain-ready" ] || [ "$(cat "$ROOT/.pipetrain-ready")" != "${PACKAGES[*]}" ]; then
  $SUDO chroot "$ROOT" /usr/bin/env DEBIAN_FRONTEND=noninteractive bash -c \
    "apt-get update -q && apt-get install -y -q --no-install-recommends ${PACKAGES[*]}" >/dev/null
  echo "${PACKAGES[*]}" | $SUDO tee "$ROOT/.pipetrain-ready" >/dev/null
fi
if [ "$PREPARE_ONLY" = 1 ]; then
  echo "pipetrain: the Debian 13 chroot in $ROOT is ready"
  exit 0
fi

# The checkout appears at /src; build and ccache stay in the chroot (cached with it).
$SUDO mkdir -p "$ROOT/src"
mount_once "$ROOT/src" --bind "$SRC"
# shellcheck disable=SC2016  # the inner script expands its variables inside the chroot
$SUDO chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
  CCACHE_DIR=/var/cache/ccache PIPETRAIN_BUILD_DIR=/build CI="${CI:-}" \
  bash -c 'set -euo pipefail
    cd /src
    start=$SECONDS
    bash scripts/build.sh -DPIPETRAIN_PYTHON=ON
    echo "pipetrain: LibTorch $(dpkg-query -W -f="\${Version}" libtorch-dev) (Debian $(cat /etc/debian_version)) build took $((SECONDS - start)) s"
    if ! ctest --test-dir /build --output-on-failure -j "$(nproc)" "$@"; then
      echo "pipetrain: tests failed; running the failed ones again to show their output last"
      ctest --test-dir /build --rerun-failed --output-on-failure || true
      exit 1
    fi' bash "$@"
