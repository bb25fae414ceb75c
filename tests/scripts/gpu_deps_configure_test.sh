#!/usr/bin/env bash
# Proves scripts/gpu-deps.sh's bundle is complete: builds it offline from this machine's installed
# packages (--from-installed: the files the .debs hold) and runs scripts/gpu-check.sh's configure
# step against it in a clean directory, CUDA off, with every system CMake package config hidden
# except LibTorch's own (a bare CUDA image has none of them), so a -dev package whose config or
# .so symlink points at a file the bundle lacks (libfmt-dev without libfmt9) fails here, in CI.
# Usage: gpu_deps_configure_test.sh REPO_ROOT; exit 77 (skipped) where the bundle's packages are
# another Debian release's (the LibTorch 2 chroot).
set -euo pipefail
ROOT=$(cd "${1:?usage: gpu_deps_configure_test.sh REPO_ROOT}" && pwd)
missing=()
while IFS= read -r pkg; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done < <(bash "$ROOT/scripts/gpu-deps.sh" --list)
if ((${#missing[@]})); then
  if grep -q '^12\.' /etc/debian_version 2>/dev/null; then
    echo "gpu_deps_configure: ${missing[*]} not installed: scripts/install-deps.sh installs them" >&2
    exit 1
  fi
  echo "gpu_deps_configure: skipped: gpu-deps.sh carries Debian 12's packages (${missing[*]} not installed here)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bash "$ROOT/scripts/gpu-deps.sh" --from-installed "$work/deps"
# Hide every installed package config (/usr/lib and its merged /lib twin) except LibTorch's and
# the ones LibTorch's own config looks for (a pip torch brings or needs none of the others).
ignore=()
for base in /usr/lib/x86_64-linux-gnu/cmake /lib/x86_64-linux-gnu/cmake /usr/share/cmake /usr/lib/cmake \
    /lib/cmake /usr/local/lib/cmake /usr/local/share/cmake; do
  [[ -d $base ]] || continue
  while IFS= read -r dir; do
    case ${dir##*/} in Torch | Caffe2 | ATen | gflags | glog) continue ;; esac
    ignore+=("$dir")
  done < <(find "$base" -maxdepth 2 \( -iname '*config.cmake' -o -iname '*-config.cmake' \) -printf '%h\n' | sort -u)
done
ignore_list=$(IFS=';'; echo "${ignore[*]}")
# Debian's torch sits under /usr, not under python's torch.utils.cmake_prefix_path as a pip one.
set +e
PYTHON=${PYTHON:-/usr/bin/python3} DEPS="$work/deps" OUT="$work/logs" bash "$ROOT/scripts/gpu-check.sh" --configure-only "$work/build" \
  -DTorch_DIR=/usr/lib/x86_64-linux-gnu/cmake/Torch -DCMAKE_IGNORE_PATH="$ignore_list" \
  -DPIPETRAIN_USE_CCACHE=OFF
rc=$?
set -e
((rc == 0)) || { echo "gpu_deps_configure: configure against the bundle failed ($rc)" >&2; exit 1; }
# Each dependency must have come from the bundle, not from a system path left unhidden.
status=0
for pkg in nlohmann_json fmt CLI11 GTest rapidcheck benchmark; do
  dir=$(sed -n "s/^${pkg}_DIR:PATH=//p" "$work/build/CMakeCache.txt")
  if [[ $dir != "$work/deps/"* ]]; then
    echo "gpu_deps_configure: $pkg came from '$dir', not from the bundle $work/deps" >&2
    status=1
  fi
done
((status == 0)) && echo "gpu_deps_configure: configured against the bundle alone"
exit $status
