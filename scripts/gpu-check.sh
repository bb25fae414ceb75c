#!/usr/bin/env bash
# The GPU check: on a machine with CUDA GPUs and a CUDA LibTorch (a pip PyTorch 2.x), build
# pipetrain against that LibTorch and run what only a GPU can show:
#   - that the CUDA and NCCL parts were built (it stops otherwise);
#   - tests that skip without CUDA (GPipe across GPUs with copy streams, dropout masks drawn on
#     the GPU and recomputed alike, the engine on cuda against one CPU process, allocator
#     statistics) and the stream/copy, device-generator and device-side wait tests;
#   - a 2-process training run of the mlp example on cuda:LOCAL_RANK (NCCL collectives where
#     each rank has a GPU of its own, else Gloo), whose summary gives the device and each
#     rank's peak GPU memory;
#   - bench/device_bench on cuda:0: 8 x (Linear(4096, 4096) + GELU), 2048 rows, fp32 and bf16,
#     the plain model against GPipe {4 pairs, 4 pairs} at chunks 1, 4 and 8, checkpoint never
#     and except_last: ms/step, ratio to the plain model, peak memory, in $LOG_DIR/device_bench.json
#     (the target: chunks 4, never, at least 0.95x the plain model).
# Needs: cmake, a C++17 compiler, and the development headers/libraries of nlohmann-json, fmt,
# CLI11, zlib, GoogleTest and RapidCheck (scripts/install-deps.sh names the Debian packages).
# A machine without them (a bare CUDA image) can be given Debian's packages unpacked into
# DEPS (default .gpudeps) by scripts/gpu-deps.sh, run where Debian's mirror is reachable.
# Usage: scripts/gpu-check.sh [build dir, default build-gpu]; logs also go to $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-gpu}
DEPS=${DEPS:-.gpudeps}
LOG_DIR=${OUT:-$BUILD_DIR}
mkdir -p "$LOG_DIR" "$BUILD_DIR"
PY=${PYTHON:-python3}
PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())'
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
for cuda in /usr/local/cuda /usr/local/cuda-*; do
  [[ -x $cuda/bin/nvcc ]] && { export CUDA_HOME=$cuda PATH=$cuda/bin:$PATH; break; }
done
ARGS=(-DCMAKE_BUILD_TYPE=Release -DPIPETRAIN_BUILD_BENCH=ON)
# Where nccl.h is: a pip torch takes it from the nvidia-nccl wheel.
NCCL=$("$PY" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "include"))' 2>/dev/null)
[[ -n $NCCL ]] && ARGS+=(-DPIPETRAIN_NCCL_HINT="$NCCL")
CXXFLAGS_EXTRA=""
if [[ -d $DEPS/usr ]]; then
  DEPS=$(cd "$DEPS" && pwd)
  PREFIX="$PREFIX;$DEPS/usr"
  ZLIB_SO=""
  for so in /usr/lib/x86_64-linux-gnu/libz.so.1 /lib/x86_64-linux-gnu/libz.so.1 /usr/lib64/libz.so.1; do
    [[ -e $so ]] && { ZLIB_SO=$so; break; }
  done
  ARGS+=(-DZLIB_INCLUDE_DIR="$DEPS/usr/include" ${ZLIB_SO:+-DZLIB_LIBRARY="$ZLIB_SO"})
  # A pip torch bundles its own fmt headers ahead of Debian's on the include path: header-only
  # fmt keeps every unit on one fmt whichever it finds.
  CXXFLAGS_EXTRA="-DFMT_HEADER_ONLY"
  # Gloo's headers, where the torch package has none of its own.
  TORCH_INCLUDE=$("$PY" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
  [[ -d $TORCH_INCLUDE/gloo ]] || CXXFLAGS_EXTRA+=" -isystem $DEPS/usr/include"
fi
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
set -e
cmake -S . -B "$BUILD_DIR" "${GENERATOR[@]}" "${ARGS[@]}" -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DCMAKE_CXX_FLAGS="$CXXFLAGS_EXTRA" 2>&1 | tee "$LOG_DIR/configure.log"
# A check that silently built the CPU-only parts would prove nothing.
if ! grep -q "pipetrain: CUDA parts on" "$LOG_DIR/configure.log"; then
  echo "gpu-check: the CUDA parts are off: this LibTorch has no libc10_cuda; use a CUDA build of PyTorch" >&2
  exit 1
fi
if ! grep -q "pipetrain: NCCL process groups on" "$LOG_DIR/configure.log"; then
  echo "gpu-check: NCCL process groups are off: nccl.h was not found; install nvidia-nccl or set PIPETRAIN_NCCL_HINT" >&2
  exit 1
fi
# The build's own status decides; the grep only shows what went wrong (under pipefail a grep
# that finds nothing, a clean build, would otherwise end the script here).
cmake --build "$BUILD_DIR" -j "$(nproc)" --target pipetrain_cli test_runtime test_engine test_comm device_bench \
  >"$LOG_DIR/build.log" 2>&1 || { grep -E "error|FAILED" "$LOG_DIR/build.log" | head -n 60; exit 1; }
set +e
status=0
"$BUILD_DIR/tests/test_runtime" --gtest_filter='Stream*:ResolveDevice*:CopyTo*:DeviceMemory*:TaskGenerator*' 2>&1 |
  tail -n 25 || status=1
"$BUILD_DIR/tests/test_comm" --gtest_filter='CollectiveBackend*:DeviceSideWait*' 2>&1 | tail -n 8 || status=1
"$BUILD_DIR/tests/test_engine" --gtest_filter='Cuda*:EngineApi.DeviceSettingPlacesTheStage' 2>&1 |
  tee "$LOG_DIR/test_engine.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED|     OK) |Failure|^\[==" | head -n 60 || status=1
# GPipe's own suite places partitions on the default devices, which are the CPU there: run it
# with the GPUs hidden (with them, the default is every visible GPU, as in torchgpipe).
CUDA_VISIBLE_DEVICES='' "$BUILD_DIR/tests/test_engine" --gtest_filter='GPipe*' 2>&1 |
  tee "$LOG_DIR/test_gpipe.log" | grep -E "^\[  (FAILED|PASSED) |Failure|^\[==" | head -n 30 || status=1
RUN_DIR=$(mktemp -d)
"$BUILD_DIR/pipetrain" train --example mlp --stages 2 --steps 20 --run-dir "$RUN_DIR" 2>&1 |
  tee "$LOG_DIR/train.log" | tail -n 8 || status=1
echo "summary: $RUN_DIR/summary.json"
"$PY" - "$RUN_DIR/summary.json" <<'PYEOF' || status=1
import json, sys
s = json.load(open(sys.argv[1]))
print({k: s[k] for k in s if any(w in k for w in ("device", "memory", "loss", "backend", "samples"))})
PYEOF
cp "$RUN_DIR/summary.json" "$LOG_DIR/" 2>/dev/null
"$BUILD_DIR/bench/device_bench" --device cuda:0 --out "$LOG_DIR/device_bench.json" 2>&1 |
  tee "$LOG_DIR/device_bench.log" | grep -v '^{' || status=1
exit $status
