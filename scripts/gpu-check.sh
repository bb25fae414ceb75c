#!/usr/bin/env bash
# The GPU check: on a machine with CUDA GPUs and a CUDA LibTorch (a pip PyTorch 2.x), build
# pipetrain against that LibTorch and run what only a GPU can show:
#   - that the CUDA and NCCL parts were built (it stops otherwise);
#   - tests that skip without CUDA (GPipe across GPUs with copy streams, dropout masks drawn on
#     the GPU and recomputed alike, nested nn::Dropout under checkpoint always vs never, a
#     checkpoint saved on cuda:0 loaded into a CPU module, the engine on cuda against one CPU
#     process, allocator statistics, a Python layer with a non-persistent buffer on cuda:0) and
#     the stream/copy, device-generator and device-side wait tests;
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
# Every step runs under `timeout` and prints one JSON line ({"step", "rc", "seconds", "log"}, also
# appended to $LOG_DIR/steps.jsonl); the whole run stays under 8 minutes (TOTAL_S, default 470 s):
# each step's limit is cut to what is left.
# Usage: scripts/gpu-check.sh [build dir, default build-gpu]; logs also go to $OUT when set.
#        scripts/gpu-check.sh --configure-only BUILD_DIR [cmake args...]: the configure step
#        alone, CUDA not required (the CTest test scripts.gpu_deps_configure runs it on the CPU).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
CONFIGURE_ONLY=0
[[ ${1:-} == --configure-only ]] && { CONFIGURE_ONLY=1; shift; }
BUILD_DIR=${1:-build-gpu}
(($#)) && shift
EXTRA_CMAKE_ARGS=("$@")
DEPS=${DEPS:-.gpudeps}
LOG_DIR=${OUT:-$BUILD_DIR}
mkdir -p "$LOG_DIR" "$BUILD_DIR"
PY=${PYTHON:-python3}
START=$SECONDS
TOTAL_S=${TOTAL_S:-470}
: >"$LOG_DIR/steps.jsonl"
# step NAME LIMIT_S LOG CMD...: runs CMD under timeout (LIMIT_S, cut to the run's time left),
# its output to LOG, and prints the step's JSON line; returns CMD's status (124: timed out).
step() {
  local name=$1 limit=$2 log=$3 left rc t0
  shift 3
  left=$((TOTAL_S - (SECONDS - START)))
  ((limit > left)) && limit=$left
  t0=$SECONDS
  if ((limit < 5)); then
    rc=124; echo "gpu-check: no time left for $name" >"$log"
  else
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1; rc=$?
  fi
  printf '{"step": "%s", "rc": %d, "seconds": %d, "limit_s": %d, "log": "%s"}\n' \
    "$name" "$rc" $((SECONDS - t0)) "$limit" "$log" | tee -a "$LOG_DIR/steps.jsonl"
  return $rc
}
PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
if ((!CONFIGURE_ONLY)); then
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())'
  timeout 20 nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
fi
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
step configure 90 "$LOG_DIR/configure.log" cmake -S . -B "$BUILD_DIR" "${GENERATOR[@]}" "${ARGS[@]}" \
  -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_CXX_FLAGS="$CXXFLAGS_EXTRA" "${EXTRA_CMAKE_ARGS[@]}" ||
  { grep -B2 -A12 "CMake Error" "$LOG_DIR/configure.log" | head -n 60; exit 1; }
((CONFIGURE_ONLY)) && exit 0
# A check that silently built the CPU-only parts would prove nothing.
if ! grep -q "pipetrain: CUDA parts on" "$LOG_DIR/configure.log"; then
  echo "gpu-check: the CUDA parts are off: this LibTorch has no libc10_cuda; use a CUDA build of PyTorch" >&2
  exit 1
fi
if ! grep -q "pipetrain: NCCL process groups on" "$LOG_DIR/configure.log"; then
  echo "gpu-check: NCCL process groups are off: nccl.h was not found; install nvidia-nccl or set PIPETRAIN_NCCL_HINT" >&2
  exit 1
fi
step build 270 "$LOG_DIR/build.log" cmake --build "$BUILD_DIR" -j "$(nproc)" \
  --target pipetrain_cli test_runtime test_engine test_comm device_bench ||
  { grep -E "error|FAILED" "$LOG_DIR/build.log" | head -n 60; exit 1; }
status=0
show() { grep -E "^\[  (FAILED|PASSED|SKIPPED|     OK) |Failure|^\[==|Skipped|skipped" "$1" | head -n "${2:-40}"; }
step test_runtime 60 "$LOG_DIR/test_runtime.log" "$BUILD_DIR/tests/test_runtime" \
  --gtest_filter='Stream*:ResolveDevice*:CopyTo*:DeviceMemory*:TaskGenerator*:DeviceRng*:Cuda*' || status=1
show "$LOG_DIR/test_runtime.log" 25
step test_comm 60 "$LOG_DIR/test_comm.log" "$BUILD_DIR/tests/test_comm" \
  --gtest_filter='CollectiveBackend*:DeviceSideWait*:Cuda*' || status=1
show "$LOG_DIR/test_comm.log" 10
# Cuda*: among them the CUDA-saved checkpoint loaded into a CPU module and nested nn::Dropout
# under checkpoint always vs never.
step test_engine 90 "$LOG_DIR/test_engine.log" "$BUILD_DIR/tests/test_engine" \
  --gtest_filter='Cuda*:EngineApi.DeviceSettingPlacesTheStage' || status=1
show "$LOG_DIR/test_engine.log" 60
# GPipe's own suite places partitions on the default devices, which are the CPU there: run it
# with the GPUs hidden (with them, the default is every visible GPU, as in torchgpipe).
step test_gpipe_cpu 60 "$LOG_DIR/test_gpipe.log" env CUDA_VISIBLE_DEVICES='' "$BUILD_DIR/tests/test_engine" \
  --gtest_filter='GPipe*' || status=1
show "$LOG_DIR/test_gpipe.log" 30
RUN_DIR=$(mktemp -d)
step train_mlp 60 "$LOG_DIR/train.log" "$BUILD_DIR/pipetrain" train --example mlp --stages 2 --steps 20 \
  --run-dir "$RUN_DIR" || status=1
tail -n 8 "$LOG_DIR/train.log"
"$PY" - "$RUN_DIR/summary.json" <<'PYEOF' || status=1
import json, sys
s = json.load(open(sys.argv[1]))
print({k: s[k] for k in s if any(w in k for w in ("device", "memory", "loss", "backend", "samples"))})
PYEOF
cp "$RUN_DIR/summary.json" "$LOG_DIR/" 2>/dev/null
step device_bench 90 "$LOG_DIR/device_bench.log" "$BUILD_DIR/bench/device_bench" --device cuda:0 \
  --out "$LOG_DIR/device_bench.json" || status=1
grep -v '^{' "$LOG_DIR/device_bench.log" | tail -n 30
# The Python front end last (its extension is the slowest build and not needed above): a Python
# layer holding a non-persistent buffer trains on cuda:0.
if step build_python 90 "$LOG_DIR/build_python.log" cmake --build "$BUILD_DIR" -j "$(nproc)" \
    --target pipetrain_python; then
  step test_python_cuda 60 "$LOG_DIR/test_python_cuda.log" env PYTHONPATH="$PWD/$BUILD_DIR/python" \
    "$PY" -m pytest -q -rs tests/python/test_layer_device.py || status=1
  tail -n 12 "$LOG_DIR/test_python_cuda.log"
else
  grep -E "error|FAILED" "$LOG_DIR/build_python.log" | head -n 30
  status=1
fi
echo "gpu-check: status $status in $((SECONDS - START)) s; steps in $LOG_DIR/steps.jsonl"
exit $status
