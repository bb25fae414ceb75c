// Per-layer costs as a stage runs them: timed one-layer StageModels, counted connected forwards.
#include "pipetrain/runtime/layer_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <memory>

#include "pipetrain/error.h"
#include "pipetrain/runtime/allocation_counter.h"
#include "pipetrain/runtime/device.h"

namespace pipetrain::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The device the profiled work runs on: the sample's (the CPU for a sample without tensors).
torch::Device device_of(const Batch& sample) {
  return sample.tensors().empty() ? torch::Device(torch::kCPU) : sample.tensors().front().device();
}

// Seconds `work` takes on `device`: on a GPU its kernels are queued when the call returns, so the
// device is synchronised before and after (nothing to wait for on the CPU).
template <typename F>
double timed_on(torch::Device device, F&& work) {
  synchronize_device(device);
  const auto t0 = Clock::now();
  work();
  synchronize_device(device);
  return seconds_since(t0);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t k = v.size();
  return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

double bytes_of(const Batch& b) {
  double bytes = 0;
  for (const auto& t : b.tensors())
    if (t.defined()) bytes += static_cast<double>(t.numel() * t.element_size());
  return bytes;
}

std::unique_ptr<torch::optim::Optimizer> optimizer_for(const std::vector<torch::Tensor>& params,
                                                       const std::string& name) {
  std::string n;
  for (char c : name) n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (n == "adam") return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-9));
  if (n == "adamw") return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-9));
  // SGD and the rest: one pass over the parameters, the cheapest update.
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(1e-9));
}

}  // namespace

LayerProfile profile_layers(const std::vector<LayerSpec>& specs, const Batch& sample,
                            const LayerProfileOptions& options) {
  if (!skip_plan(specs).empty())
    throw ConfigError("the layer profile runs each layer on its own, which a model with skip connections "
                      "does not allow (resnet); plan a model without skips");
  torch::AutoGradMode grad_mode(true);
  BuiltLayers all = build_layers(specs, 0, static_cast<int64_t>(specs.size()));
  const size_t n = all.modules.size();
  // One-layer chunks, as stages of one layer would hold them. Tied uses share their module.
  std::vector<std::unique_ptr<StageModel>> chunks;
  StageModelOptions stage = options.stage;
  stage.checkpoint_interval = 0;
  stage.skips = nullptr;
  for (size_t i = 0; i < n; ++i) {
    BuiltLayers one;
    one.modules = {all.modules[i]};
    one.specs = {all.specs[i]};
    one.begin = static_cast<int64_t>(i);
    chunks.push_back(std::make_unique<StageModel>(std::move(one), stage));
    chunks.back()->train(true);
  }

  LayerProfile profile;
  profile.layers.resize(n);
  profile.input_bytes = bytes_of(sample);
  for (const auto& c : chunks) profile.accumulates_natively = profile.accumulates_natively || c->accumulates_natively();
  profile.rows = sample.tensors().empty() ? 0 : sample.tensors().front().size(0);
  std::vector<std::string> seen_tied;
  for (size_t i = 0; i < n; ++i) {
    const auto& spec = all.specs[i];
    if (spec.tied()) {
      if (std::find(seen_tied.begin(), seen_tied.end(), spec.tied_key) != seen_tied.end()) continue;
      seen_tied.push_back(spec.tied_key);
    }
    for (const auto& p : all.modules[i].ptr()->parameters())
      profile.layers[i].param_bytes += static_cast<double>(p.numel() * p.element_size());
  }

  // Activation bytes: one connected forward, counted.
  {
    AllocationCounter counter;
    Batch x = sample;
    int64_t before = counter.live_bytes();
    for (size_t i = 0; i < n; ++i) {
      // The fast path keeps its input for the weight gradient, after the graph is gone.
      if (chunks[i]->num_deferred_linear() > 0) profile.layers[i].weight_bytes = bytes_of(x);
      x = chunks[i]->forward(x, 0);
      const int64_t after = counter.live_bytes();
      profile.layers[i].activation_bytes = static_cast<double>(std::max<int64_t>(after - before, 0));
      profile.layers[i].output_bytes = bytes_of(x);
      before = after;
    }
    for (auto& c : chunks) c->clear();
  }

  // State: what one step leaves behind per layer (gradients, optimizer state, cached copies),
  // counted from a fresh copy of each layer's parameters being trained once.
  {
    Batch x = sample;
    for (size_t i = 0; i < n; ++i) {
      Batch out;
      std::unique_ptr<torch::optim::Optimizer> opt;
      int64_t live = 0;
      {
        AllocationCounter counter;
        {
          const Batch in = detached_input(x);
          Batch y = chunks[i]->forward(in, 0);
          chunks[i]->prepare_backward();
          backward_ones(y);
          if (chunks[i]->has_deferred_weights()) chunks[i]->backward_weight({0});
          chunks[i]->finish_weight_groups();
          if (profile.layers[i].param_bytes > 0) {
            opt = optimizer_for(all.modules[i].ptr()->parameters(), options.optimizer);
            opt->step();
            chunks[i]->weights_changed();
          }
          std::vector<torch::Tensor> next;
          for (const auto& t : y.tensors()) next.push_back(t.detach());
          out = y.with(std::move(next));
        }
        live = counter.live_bytes() - static_cast<int64_t>(bytes_of(out));
      }
      profile.layers[i].state_bytes = static_cast<double>(std::max<int64_t>(live, 0));
      x = out;
    }
  }

  // Times: each layer on its own detached input, forward / backward / weight gradient.
  // Per layer and phase, one sample per counted pass; the median resists the preemptions of a
  // shared machine (a mean would let one descheduled pass move the balance).
  std::vector<std::vector<double>> f(n), b(n), w(n);
  std::vector<double> o(n, 0);
  int64_t counted = 0;
  const torch::Device device = device_of(sample);
  const auto start = Clock::now();
  for (int64_t pass = 0;; ++pass) {
    Batch x = sample;
    for (size_t i = 0; i < n; ++i) {
      const Batch in = detached_input(x);
      Batch y;
      const double tf = timed_on(device, [&] { y = chunks[i]->forward(in, 0); });
      chunks[i]->prepare_backward();
      const double tb = timed_on(device, [&] { backward_ones(y); });
      double tw = 0;  // layers without the fast path computed theirs in the backward
      if (chunks[i]->has_deferred_weights()) {
        tw = timed_on(device, [&] {
          chunks[i]->backward_weight({0});
          chunks[i]->finish_weight_groups();
        });
      }
      if (pass > 0) {
        f[i].push_back(tf);
        b[i].push_back(tb);
        w[i].push_back(tw);
      }
      std::vector<torch::Tensor> next;
      for (const auto& t : y.tensors()) next.push_back(t.detach());
      x = y.with(std::move(next));
    }
    if (pass > 0) ++counted;
    if (pass >= options.min_passes - 1 && counted > 0 && Clock::now() - start >= options.budget) break;
  }
  // The end of a step over each layer's parameters (with the gradients the passes left), as the
  // engine runs it: the gradient norm (each gradient's norm read back, as for the global norm
  // and the non-finite check), then the optimizer step. A stage's step follows its weight-
  // gradient pass over all its layers, so its tensors come from memory; timed in cache (as
  // before 2026-12-05) it was 0.07 ms per 4 MiB layer where the engine took 0.5.
  auto evict = torch::zeros({std::max<int64_t>(options.evict_bytes / 4, 1)});
  for (size_t i = 0; i < n; ++i) {
    if (profile.layers[i].param_bytes == 0) continue;
    const auto params = all.modules[i].ptr()->parameters();
    auto opt = optimizer_for(params, options.optimizer);
    opt->step();  // state allocated outside the timing, as after the first step of a run
    std::vector<double> times;
    for (int r = 0; r < 5; ++r) {
      (void)evict.sum().item<float>();
      times.push_back(timed_on(device, [&] {
        for (const auto& p : params) {
          // The weight-gradient kernel summed a fast-path weight's squares on the way, as the
          // engine then takes them (with one replica: with several it reads the gradient again,
          // about 0.16 ms per 4 MiB here, which this profile does not charge).
          if (p.grad().defined() && !chunks[i]->weight_grad_sqnorm(p)) (void)p.grad().norm().item<double>();
        }
        opt->step();
      }));
    }
    o[i] = median(times);
  }
  for (size_t i = 0; i < n; ++i) {
    auto& c = profile.layers[i];
    c.forward_s = median(f[i]);
    c.backward_input_s = median(b[i]);
    c.backward_weight_s = median(w[i]);
    c.optimizer_s = o[i];
  }
  return profile;
}

Batch detached_input(const Batch& batch) {
  std::vector<torch::Tensor> values;
  for (const auto& t : batch.tensors()) {
    auto d = t.detach();
    if (d.is_floating_point()) d.requires_grad_(true);
    values.push_back(d);
  }
  return batch.with(std::move(values));
}

void backward_ones(const Batch& output) {
  std::vector<torch::Tensor> outputs, grads;
  for (const auto& t : output.tensors()) {
    if (t.defined() && t.requires_grad()) {
      outputs.push_back(t);
      grads.push_back(torch::ones_like(t));
    }
  }
  if (!outputs.empty()) torch::autograd::backward(outputs, grads);
}

}  // namespace pipetrain::runtime
