#!/usr/bin/env bash
# Unpacks the Debian packages scripts/gpu-check.sh needs on a bare CUDA machine (headers and
# libraries a pip PyTorch image lacks) into .gpudeps/, here, where Debian's mirror is reachable;
# the folder then travels with the checkout (the device tool's `carry`: about 11 MiB).
# Every -dev package comes with the runtime library its .so symlink and CMake config point to
# (libfmt-dev's fmt-targets.cmake checks that libfmt.so.9.1.0, from libfmt9, exists): the
# CTest test scripts.gpu_deps_configure configures pipetrain against the bundle alone.
# Usage: scripts/gpu-deps.sh [--from-installed] [folder, default .gpudeps]
#   --from-installed: copy the packages' files from this machine's installed packages instead of
#   downloading them (offline; the same files where the installed versions are the mirror's).
#   --list: print the package names and exit.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(nlohmann-json3-dev libfmt-dev libfmt9 libcli11-dev libgtest-dev libgmock-dev librapidcheck-dev
  zlib1g-dev libgloo-dev libgloo0 libbenchmark-dev libbenchmark1debian)
FROM_INSTALLED=0
case ${1:-} in
  --list) printf '%s\n' "${PACKAGES[@]}"; exit 0 ;;
  --from-installed) FROM_INSTALLED=1; shift ;;
esac
DEPS=${1:-.gpudeps}
rm -rf "$DEPS"
mkdir -p "$DEPS"
if ((FROM_INSTALLED)); then
  for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
      { echo "gpu-deps: package $pkg is not installed here: install it, or run without --from-installed" >&2; exit 1; }
  done
  # Files and symlinks only (a package's directories are created as their files are).
  dpkg-query -L "${PACKAGES[@]}" | while IFS= read -r f; do
    [[ -d $f && ! -L $f ]] || printf '%s\n' "${f#/}"
  done | tar -C / -cf - --no-recursion -T - | tar -C "$DEPS" -xf -
else
  download=$(mktemp -d)
  trap 'rm -rf "$download"' EXIT
  # apt-get download writes into the current directory, as the _apt user where it can.
  chmod 777 "$download"
  (cd "$download" && apt-get download "${PACKAGES[@]}" >/dev/null)
  for deb in "$download"/*.deb; do dpkg -x "$deb" "$DEPS"; done
fi
echo "gpu-deps: ${#PACKAGES[@]} packages unpacked into $DEPS ($(du -sh "$DEPS" | cut -f1))"
