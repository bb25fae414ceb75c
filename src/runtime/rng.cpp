// Random-number state: snapshots, seeded scopes and the thread-local task generator.
#include "pipetrain/runtime/rng.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>

#include <string>

#include "pipetrain/error.h"

namespace pipetrain::runtime {
namespace {

thread_local at::Generator task_generator_;  // undefined: none installed

// What covers this thread's draws from the default generator.
enum Policy { kUncovered = 0, kLeased = 1, kFree = 2 };
thread_local int policy_ = kUncovered;
thread_local DefaultGeneratorLease* active_lease_ = nullptr;
thread_local int lock_depth_ = 0;  // how many times this thread holds rng_mutex()

}  // namespace

// The engine's words and the cached normal samples: every draw changes one of them. (The state
// tensor cannot be compared: it is a raw copy of a struct whose padding bytes are garbage.)
CpuGeneratorPosition CpuGeneratorPosition::of(const at::Generator& g) {
  at::Generator gen = g;
  std::lock_guard<std::mutex> lock(gen.mutex());
  auto* impl = gen.get<at::CPUGeneratorImpl>();
  const auto data = impl->engine().data();
  CpuGeneratorPosition p;
  p.left = data.left_;
  p.next = data.next_;
  p.words = data.state_;
  const auto f = impl->next_float_normal_sample();
  const auto d = impl->next_double_normal_sample();
  p.cached_float = f.has_value() ? std::optional<float>(*f) : std::nullopt;
  p.cached_double = d.has_value() ? std::optional<double>(*d) : std::nullopt;
  return p;
}

bool CpuGeneratorPosition::operator==(const CpuGeneratorPosition& o) const {
  return left == o.left && next == o.next && words == o.words && cached_float == o.cached_float &&
         cached_double == o.cached_double;
}

RngSnapshot RngSnapshot::capture() {
  RngSnapshot snapshot;
  snapshot.cpu = generator_state(at::detail::getDefaultCPUGenerator());
  snapshot.cpu_position = CpuGeneratorPosition::of(at::detail::getDefaultCPUGenerator());
  const int64_t cuda_devices = static_cast<int64_t>(torch::cuda::device_count());
  for (int64_t d = 0; d < cuda_devices; ++d) {
    snapshot.cuda.push_back(
        generator_state(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, d))));
  }
  return snapshot;
}

RngSnapshot RngSnapshot::capture_devices() {
  RngSnapshot snapshot;
  const int64_t cuda_devices = static_cast<int64_t>(torch::cuda::device_count());
  for (int64_t d = 0; d < cuda_devices; ++d) {
    snapshot.cuda.push_back(
        generator_state(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, d))));
  }
  return snapshot;
}

RngSnapshot checkpoint_rng_snapshot() {
  return free_of_draws() ? RngSnapshot::capture_devices() : RngSnapshot::capture();
}

void RngSnapshot::restore() const {
  if (cpu.defined()) set_generator_state(at::detail::getDefaultCPUGenerator(), cpu);
  restore_cuda();
}

void RngSnapshot::restore_cuda() const {
  for (size_t d = 0; d < cuda.size(); ++d) {
    set_generator_state(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(d))),
                        cuda[d]);
  }
}

bool RngSnapshot::moved_since() const {
  const RngSnapshot now = cpu.defined() ? capture() : capture_devices();
  if (cpu.defined() && !(now.cpu_position == cpu_position)) return true;
  for (size_t d = 0; d < cuda.size() && d < now.cuda.size(); ++d) {
    if (!torch::equal(now.cuda[d], cuda[d])) return true;
  }
  return false;
}

std::recursive_timed_mutex& rng_mutex() {
  static std::recursive_timed_mutex mutex;
  return mutex;
}

namespace {
std::unique_lock<std::recursive_timed_mutex> lock_rng(const char* who) {
  std::unique_lock<std::recursive_timed_mutex> lock(rng_mutex(), std::defer_lock);
  if (!lock.try_lock_for(kRngLockTimeout)) {
    throw TimeoutError(std::string(who) + ": the default random generator stayed taken for " +
                       std::to_string(kRngLockTimeout.count()) +
                       " s; a pipeline task that timed out still holds it (its layer hangs): fix that layer");
  }
  return lock;
}
}  // namespace

SeededScope::SeededScope(uint64_t seed) : lock_(lock_rng("SeededScope")) {
  ++lock_depth_;
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  saved_cpu_ = gen.get_state();
  gen.set_current_seed(seed);
}

SeededScope::~SeededScope() {
  --lock_depth_;
  set_generator_state(at::detail::getDefaultCPUGenerator(), saved_cpu_);
}

at::Generator make_generator(uint64_t seed) { return at::detail::createCPUGenerator(seed); }

at::Generator make_generator(uint64_t seed, const c10::Device& device) {
  if (device.is_cpu()) return make_generator(seed);
  at::Generator gen = clone_generator(at::globalContext().defaultGenerator(device));
  gen.set_current_seed(seed);  // CUDA: also starts its Philox offset at 0
  return gen;
}

torch::Tensor generator_state(const at::Generator& generator) {
  at::Generator gen = generator;  // shares the impl; the mutex is the generator's own
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(const at::Generator& generator, const torch::Tensor& state) {
  at::Generator gen = generator;
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

at::Generator generator_with_state(const torch::Tensor& state) {
  at::Generator gen = make_generator(0);
  set_generator_state(gen, state);
  return gen;
}

at::Generator current_generator() {
  if (task_generator_.defined()) return task_generator_;
  return at::detail::getDefaultCPUGenerator();
}

at::Generator current_generator(const c10::Device& device) {
  at::Generator source = current_generator();
  if (device.is_cpu()) return source;
  uint64_t seed = 0;
  {
    std::lock_guard<std::mutex> lock(source.mutex());
    seed = at::check_generator<at::CPUGeneratorImpl>(source)->random64();
  }
  return make_generator(seed, device);
}

bool has_task_generator() { return task_generator_.defined(); }

TaskGeneratorScope::TaskGeneratorScope(at::Generator generator)
    : previous_(std::move(task_generator_)) {
  task_generator_ = std::move(generator);
}

TaskGeneratorScope::~TaskGeneratorScope() { task_generator_ = std::move(previous_); }

namespace {
at::Generator device_generator(size_t d) {
  return at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(d)));
}
}  // namespace

DefaultGeneratorLease::DefaultGeneratorLease()
    : outer_(active_lease_), lock_(lock_rng("DefaultGeneratorLease")), previous_policy_(policy_) {
  installed_ = CpuGeneratorPosition::of(at::detail::getDefaultCPUGenerator());
  devices_installed_ = RngSnapshot::capture_devices().cuda;
  policy_ = kLeased;
  active_lease_ = this;
  ++lock_depth_;
}

DefaultGeneratorLease::DefaultGeneratorLease(at::Generator stream)
    : outer_(active_lease_),
      lock_(lock_rng("DefaultGeneratorLease")),
      stream_(std::move(stream)),
      previous_policy_(policy_) {
  const at::Generator cpu = at::detail::getDefaultCPUGenerator();
  saved_ = generator_state(cpu);
  set_generator_state(cpu, generator_state(stream_));
  // Each device generator starts from a seed the task's stream draws (its draws on a GPU then
  // depend on the task, not on which task ran first); its own state comes back at the end.
  devices_saved_ = RngSnapshot::capture_devices().cuda;
  for (size_t d = 0; d < devices_saved_.size(); ++d) {
    uint64_t seed = 0;
    {
      at::Generator gen = cpu;
      std::lock_guard<std::mutex> lock(gen.mutex());
      seed = at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
    }
    at::Generator device = device_generator(d);
    std::lock_guard<std::mutex> lock(device.mutex());
    device.set_current_seed(seed);
  }
  installed_ = CpuGeneratorPosition::of(cpu);
  devices_installed_ = RngSnapshot::capture_devices().cuda;
  policy_ = kLeased;
  active_lease_ = this;
  ++lock_depth_;
}

DefaultGeneratorLease::~DefaultGeneratorLease() {
  policy_ = previous_policy_;
  active_lease_ = outer_;
  --lock_depth_;
  if (!stream_.defined()) return;
  const at::Generator cpu = at::detail::getDefaultCPUGenerator();
  set_generator_state(stream_, generator_state(cpu));
  set_generator_state(cpu, saved_);
  for (size_t d = 0; d < devices_saved_.size(); ++d) set_generator_state(device_generator(d), devices_saved_[d]);
}

bool DefaultGeneratorLease::drew() const {
  if (!(CpuGeneratorPosition::of(at::detail::getDefaultCPUGenerator()) == installed_)) return true;
  for (size_t d = 0; d < devices_installed_.size(); ++d) {
    if (!torch::equal(generator_state(device_generator(d)), devices_installed_[d])) return true;
  }
  return false;
}

LeaseSuspension::LeaseSuspension() {
  if (!active_lease_ || lock_depth_ != 1 || !active_lease_->lock_.owns_lock()) return;
  lease_ = active_lease_;
  const at::Generator cpu = at::detail::getDefaultCPUGenerator();
  progress_ = generator_state(cpu);
  if (lease_->stream_.defined()) set_generator_state(cpu, lease_->saved_);
  lease_->lock_.unlock();
}

LeaseSuspension::~LeaseSuspension() {
  if (!lease_) return;
  lease_->lock_.lock();
  const at::Generator cpu = at::detail::getDefaultCPUGenerator();
  if (lease_->stream_.defined()) lease_->saved_ = generator_state(cpu);
  set_generator_state(cpu, progress_);
}

bool default_generator_covered() { return policy_ != kUncovered; }

bool free_of_draws() { return policy_ == kFree; }

FreeOfDrawsScope::FreeOfDrawsScope() : previous_policy_(policy_) {
  if (policy_ == kUncovered) policy_ = kFree;
}

FreeOfDrawsScope::~FreeOfDrawsScope() { policy_ = previous_policy_; }

LearnedLease::LearnedLease(DrawHistory& history, bool training, at::Generator stream)
    : slot_(history.by_mode[training ? 1 : 0]), exceptions_(std::uncaught_exceptions()) {
  if (slot_.load() == DrawHistory::kDrawsNothing) {
    free_.emplace();
  } else if (stream.defined()) {
    lease_.emplace(std::move(stream));
  } else {
    lease_.emplace();
  }
}

LearnedLease::~LearnedLease() {
  if (lease_ && std::uncaught_exceptions() == exceptions_) {
    slot_.store(lease_->drew() ? DrawHistory::kDraws : DrawHistory::kDrawsNothing);
  }
}

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
