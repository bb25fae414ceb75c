#!/usr/bin/env bash
# The GPU check: on a machine with CUDA GPUs and a CUDA LibTorch (a pip PyTorch 2.x), build
# pipetrain against that LibTorch and run what only a GPU can show:
#   - tests that skip without CUDA (GPipe across GPUs with copy streams, the engine on cuda
#     against one CPU process, allocator statistics) and the stream/copy tests;
#   - a 2-process training run of the mlp example on cuda:LOCAL_RANK (NCCL collectives),
#     whose summary gives the device and each rank's peak GPU memory.
# Needs: cmake, a C++17 compiler, and the development headers/libraries of nlohmann-json, fmt,
# CLI11, zlib, GoogleTest and RapidCheck (scripts/install-deps.sh names the Debian packages).
# Usage: scripts/gpu-check.sh [build dir, default build-gpu]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-gpu}
PY=${PYTHON:-python3}
PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())'
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DPIPETRAIN_BUILD_BENCH=OFF
cmake --build "$BUILD_DIR" -j "$(nproc)" --target pipetrain_cli test_runtime test_engine
"$BUILD_DIR/tests/test_runtime" --gtest_filter='Stream*:ResolveDevice*:CopyTo*'
"$BUILD_DIR/tests/test_engine" --gtest_filter='Cuda*:GPipe*:EngineApi.DeviceSettingPlacesTheStage'
RUN_DIR=$(mktemp -d)
"$BUILD_DIR/pipetrain" train --example mlp --stages 2 --steps 20 --run-dir "$RUN_DIR" | tail -n 3
echo "summary: $RUN_DIR/summary.json"
