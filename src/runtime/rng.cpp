// Random-number state: snapshots, seeded scopes and the thread-local task generator.
#include "pipetrain/runtime/rng.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>

namespace pipetrain::runtime {
namespace {

thread_local at::Generator task_generator_;  // undefined: none installed

torch::Tensor state_of(const at::Generator& g) {
  at::Generator gen = g;  // shares the impl; the mutex is the generator's own
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_state_of(const at::Generator& g, const torch::Tensor& state) {
  at::Generator gen = g;
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

RngSnapshot RngSnapshot::capture() {
  RngSnapshot snapshot;
  snapshot.cpu = state_of(at::detail::getDefaultCPUGenerator());
  const int64_t cuda_devices = static_cast<int64_t>(torch::cuda::device_count());
  for (int64_t d = 0; d < cuda_devices; ++d) {
    snapshot.cuda.push_back(
        state_of(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, d))));
  }
  return snapshot;
}

void RngSnapshot::restore() const {
  if (cpu.defined()) set_state_of(at::detail::getDefaultCPUGenerator(), cpu);
  for (size_t d = 0; d < cuda.size(); ++d) {
    set_state_of(at::globalContext().defaultGenerator(
                     c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(d))),
                 cuda[d]);
  }
}

std::recursive_mutex& rng_mutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

SeededScope::SeededScope(uint64_t seed) : lock_(rng_mutex()) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  saved_cpu_ = gen.get_state();
  gen.set_current_seed(seed);
}

SeededScope::~SeededScope() { set_state_of(at::detail::getDefaultCPUGenerator(), saved_cpu_); }

at::Generator make_generator(uint64_t seed) { return at::detail::createCPUGenerator(seed); }

at::Generator current_generator() {
  if (task_generator_.defined()) return task_generator_;
  return at::detail::getDefaultCPUGenerator();
}

bool has_task_generator() { return task_generator_.defined(); }

TaskGeneratorScope::TaskGeneratorScope(at::Generator generator)
    : previous_(std::move(task_generator_)) {
  task_generator_ = std::move(generator);
}

TaskGeneratorScope::~TaskGeneratorScope() { task_generator_ = std::move(previous_); }

at::Generator clone_generator(const at::Generator& generator) {
  at::Generator gen = generator;
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.clone();
}

uint64_t task_seed(uint64_t base, int64_t i, int64_t j) {
  uint64_t z = base + 0x9E3779B97F4A7C15ULL * (static_cast<uint64_t>(i) * 0x10001ULL +
                                               static_cast<uint64_t>(j) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace pipetrain::runtime
