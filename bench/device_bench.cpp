// GPipe against the plain model on one device, the baseline measured in the same run: a GPU for
// scripts/gpu-check.sh; the CPU runs it too, small, as a CTest test.
//
// Model: layers x (Linear(width, width) + GELU) on `rows` rows, MSE loss, SGD, in fp32 and in
// bf16 autocast (float32 weights). The plain model on the device, then GPipe with two equal
// partitions, both on that device, at chunks 1, 4 and 8 and checkpoint never and except_last.
// Every step ends with the device synchronised; per configuration it reports the median ms per
// step, the ratio of the plain model's to it (x_plain > 1: GPipe is faster) and the device's
// peak allocated memory (where the allocator keeps statistics), as text and as one JSON file.
// The first step's loss of every GPipe run must equal the plain model's (same weights, same
// data): the program exits 1 otherwise, or when a loss is not finite.
//
//   build/bench/device_bench --device cuda:0 --out gpu-gpipe.json     (8 x 4096, 2048 rows)
//   build/bench/device_bench --device cpu --layers 4 --width 64 --rows 64 --steps 3
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "pipetrain/engine/gpipe.h"
#include "pipetrain/runtime/autocast.h"
#include "pipetrain/runtime/device.h"

namespace {

using nlohmann::json;
using pipetrain::Checkpoint;

struct Args {
  std::string device = "cuda:0";
  int64_t layers = 8;
  int64_t width = 4096;
  int64_t rows = 2048;
  int steps = 20;
  int warmup = 3;
  std::vector<std::string> precisions{"fp32", "bf16"};
  std::vector<int64_t> chunks{1, 4, 8};
  std::string out;
};

torch::nn::Sequential make_model(const Args& a) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int64_t i = 0; i < a.layers; ++i) {
    model->push_back(torch::nn::Linear(a.width, a.width));
    model->push_back(torch::nn::GELU());
  }
  return model;
}

struct Measured {
  double first_loss = 0;
  double last_loss = 0;
  double ms_per_step = 0;  // median
  std::optional<int64_t> peak_bytes;
};

// Trains `steps` timed steps after `warmup` untimed ones; the device is synchronised at every
// step's end, so a step's time is the device's, not the host's queueing.
template <typename Forward>
Measured run(const Args& a, torch::Device device, c10::ScalarType dtype, torch::nn::Module& params,
             Forward&& forward) {
  torch::manual_seed(1);
  const auto x = torch::randn({a.rows, a.width}).to(device);
  const auto y = torch::randn({a.rows, a.width}).to(device);
  torch::optim::SGD sgd(params.parameters(), torch::optim::SGDOptions(1e-3));
  auto step = [&] {
    sgd.zero_grad();
    torch::Tensor out;
    {
      pipetrain::runtime::AutocastScope autocast(device, dtype);
      out = forward(x);
    }
    torch::Tensor loss = torch::mse_loss(out.to(torch::kFloat32), y);
    loss.backward();
    sgd.step();
    pipetrain::runtime::synchronize_device(device);
    return loss.item<double>();
  };
  pipetrain::runtime::synchronize_device(device);
  pipetrain::runtime::reset_peak_device_memory(device);
  Measured m;
  m.first_loss = step();
  for (int k = 1; k < a.warmup; ++k) step();
  std::vector<double> ms;
  for (int k = 0; k < a.steps; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    m.last_loss = step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  m.ms_per_step = ms[ms.size() / 2];
  m.peak_bytes = pipetrain::runtime::peak_device_memory_bytes(device);
  return m;
}

json to_json(const Measured& m) {
  json j{{"ms_per_step", m.ms_per_step}, {"first_loss", m.first_loss}, {"last_loss", m.last_loss}};
  j["peak_mb"] = m.peak_bytes ? json(static_cast<double>(*m.peak_bytes) / (1 << 20)) : json(nullptr);
  return j;
}

std::string mb(const std::optional<int64_t>& bytes) {
  return bytes ? fmt::format("{:9.1f}", static_cast<double>(*bytes) / (1 << 20)) : std::string("        -");
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app("GPipe against the plain model on one device (ms/step, ratio, peak memory)");
  app.add_option("--device", a.device, "cuda:N or cpu")->capture_default_str();
  app.add_option("--layers", a.layers, "Linear + GELU pairs")->check(CLI::Range(int64_t{2}, int64_t{1024}));
  app.add_option("--width", a.width, "features")->check(CLI::PositiveNumber);
  app.add_option("--rows", a.rows, "rows per step")->check(CLI::PositiveNumber);
  app.add_option("--steps", a.steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", a.warmup, "untimed steps first (at least the one that checks the loss)")
      ->check(CLI::PositiveNumber);
  app.add_option("--precisions", a.precisions, "fp32 and/or bf16")->delimiter(',');
  app.add_option("--chunks", a.chunks, "GPipe micro-batches to try")->delimiter(',');
  app.add_option("--out", a.out, "the results JSON");
  CLI11_PARSE(app, argc, argv);

  const torch::Device device(a.device);
  const std::vector<torch::Device> devices{device, device};
  json results{{"device", device.str()},
               {"libtorch", TORCH_VERSION},
               {"model", {{"layers", a.layers}, {"width", a.width}, {"rows", a.rows}, {"activation", "GELU"}}},
               {"steps", a.steps},
               {"balance", {a.layers, a.layers}}};
  bool ok = true;
  for (const auto& precision : a.precisions) {
    const auto dtype = pipetrain::runtime::compute_dtype(precision);
    if (dtype != c10::ScalarType::Float && !pipetrain::runtime::low_precision_supported(device, dtype)) {
      std::cout << precision << ": this LibTorch does not compute it on " << device << "; skipped\n";
      results["precisions"][precision] = {{"skipped", "not supported on this device"}};
      continue;
    }
    auto plain_model = make_model(a);
    plain_model->to(device);
    const Measured plain =
        run(a, device, dtype, *plain_model, [&](const torch::Tensor& x) { return plain_model->forward(x); });
    json entry{{"plain", to_json(plain)}, {"gpipe", json::array()}};
    std::cout << fmt::format("{} on {}: {} x (Linear({}, {}) + GELU), {} rows\n", precision, device.str(), a.layers,
                             a.width, a.width, a.rows);
    std::cout << fmt::format("  {:<26} {:>10} {:>8} {:>9}\n", "", "ms/step", "x_plain", "peak MiB");
    std::cout << fmt::format("  {:<26} {:10.2f} {:8.3f} {}\n", "plain", plain.ms_per_step, 1.0, mb(plain.peak_bytes));
    const double tolerance = dtype == c10::ScalarType::Float ? 1e-4 : 2e-2;
    for (const int64_t chunks : a.chunks) {
      for (const Checkpoint mode : {Checkpoint::Never, Checkpoint::ExceptLast}) {
        auto model = make_model(a);
        // Each partition holds layers / 2 of the Linear + GELU pairs.
        pipetrain::GPipe gpipe(model, pipetrain::GPipeOptions({a.layers, a.layers})
                                          .chunks(chunks)
                                          .checkpoint(mode)
                                          .devices(devices));
        const Measured m = run(a, device, dtype, *gpipe, [&](const torch::Tensor& x) { return gpipe->forward(x); });
        const double x_plain = plain.ms_per_step / m.ms_per_step;
        auto j = to_json(m);
        j["chunks"] = chunks;
        j["checkpoint"] = pipetrain::to_string(mode);
        j["x_plain"] = x_plain;
        entry["gpipe"].push_back(j);
        std::cout << fmt::format("  {:<26} {:10.2f} {:8.3f} {}\n",
                                 fmt::format("gpipe chunks {} {}", chunks, pipetrain::to_string(mode)), m.ms_per_step,
                                 x_plain, mb(m.peak_bytes));
        const bool same_first = std::abs(m.first_loss - plain.first_loss) <= tolerance * std::abs(plain.first_loss);
        if (!same_first || !std::isfinite(m.last_loss)) {
          std::cout << fmt::format("  FAILED: first loss {:.8f}, the plain model's {:.8f}; last loss {}\n",
                                   m.first_loss, plain.first_loss, m.last_loss);
          ok = false;
        }
      }
    }
    results["precisions"][precision] = entry;
  }
  results["first_losses_match"] = ok;
  if (!a.out.empty()) std::ofstream(a.out) << results.dump(2) << "\n";
  std::cout << results.dump() << "\n";
  return ok ? 0 : 1;
}
