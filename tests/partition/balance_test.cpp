// Automatic balancing: costs by parameters, type, size and time, and their balances.
#include "pipetrain/partition/balance.h"

#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "pipetrain/error.h"
#include "pipetrain/skip/skippable.h"

namespace pipetrain {
namespace {

// A layer whose forward takes a fixed time: a timing cost that a loaded machine cannot hide.
struct SleepImpl : torch::nn::Module {
  explicit SleepImpl(int ms) : ms(ms) {}
  torch::Tensor forward(torch::Tensor x) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return x * 1.0;
  }
  int ms;
};
TORCH_MODULE(Sleep);

TEST(Balance, Uniform) {
  EXPECT_EQ(balance_uniform(10, 3), (std::vector<int64_t>{4, 3, 3}));
  EXPECT_EQ(balance_uniform(4, 4), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_THROW(balance_uniform(2, 3), ConfigError);
}

TEST(Balance, ByParameters) {
  torch::nn::Sequential model(torch::nn::Linear(10, 10), torch::nn::ReLU(), torch::nn::Linear(10, 10),
                              torch::nn::ReLU(), torch::nn::Linear(10, 100), torch::nn::Linear(100, 10));
  EXPECT_EQ(parameter_costs(model), (std::vector<double>{110, 0, 110, 0, 1100, 1010}));
  EXPECT_EQ(balance_by_params(2, model), (std::vector<int64_t>{5, 1}));
}

TEST(Balance, ByParametersOfSpecsCountsTiedModulesOnce) {
  auto embed = [] { return torch::nn::AnyModule(torch::nn::Embedding(100, 8)); };
  std::vector<LayerSpec> specs{LayerSpec::tied_layer("e", "Embedding", "Embedding", embed),
                               LayerSpec::of<torch::nn::Linear>("Linear", 8, 8),
                               LayerSpec::tied_layer("e", "Embedding", "Embedding", embed)};
  EXPECT_EQ(parameter_costs(specs), (std::vector<double>{800, 72, 0}));
}

TEST(Balance, ByTypeRegex) {
  std::vector<LayerSpec> specs;
  for (int i = 0; i < 4; ++i) {
    specs.push_back(LayerSpec::of<torch::nn::Linear>("Linear", 4, 4));
    specs.push_back(LayerSpec::of<torch::nn::ReLU>("ReLU"));
  }
  EXPECT_EQ(type_costs(specs, "^linear$"), (std::vector<double>{1, 0, 1, 0, 1, 0, 1, 0}));
  EXPECT_EQ(min_max_partition(type_costs(specs, "linear"), 2), (std::vector<int64_t>{3, 5}));
  torch::nn::Sequential model(torch::nn::Linear(4, 4), torch::nn::ReLU());
  EXPECT_EQ(type_costs(model, "ReLU"), (std::vector<double>{0, 1}));
  try {
    type_costs(specs, "Conv2d");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("Linear, ReLU"), std::string::npos) << e.what();
  }
  EXPECT_THROW(type_costs(specs, "(unclosed"), ConfigError);
}

TEST(Balance, BySizeCountsParametersAndActivations) {
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::ReLU());
  const auto costs = size_costs(model, Batch(torch::ones({3, 4})), /*param_scale=*/2.0);
  EXPECT_EQ(costs, (std::vector<double>{2.0 * 40 * 4 + 3 * 8 * 4, 3 * 8 * 4}));
}

// The heavy layer sleeps 250 ms, the others 1 ms: a busy machine adds its wake-up delay to every
// layer alike, and would need to add 60 ms to each to make four light layers cost as much as the
// heavy one (where its own stage stops being the only optimum).
TEST(Balance, ByTimeGivesAHeavyLayerItsOwnStage) {
  torch::nn::Sequential model;
  for (int i = 0; i < 8; ++i) model->push_back(Sleep(i == 3 ? 250 : 1));
  TimeProfileOptions options;
  options.budget = std::chrono::milliseconds(200);
  const auto costs = time_costs(model, Batch(torch::ones({2, 2})), options);
  EXPECT_GE(costs[3], 0.25) << "the sleep is the least a layer's time can be";
  EXPECT_GT(costs[3], costs[0] + costs[1] + costs[2]);
  EXPECT_GT(costs[3], costs[4] + costs[5] + costs[6] + costs[7]);
  EXPECT_EQ(balance_by_time(3, model, Batch(torch::ones({2, 2})), options),
            (std::vector<int64_t>{3, 1, 4}));
}

// --- profiling leaves the model as it was -------------------------------------------------

// Everything of a model that profiling could change, by name.
struct ModelState {
  std::map<std::string, torch::Tensor> values;  // parameters and buffers
  std::map<std::string, torch::Tensor> grads;   // undefined where the gradient is
  std::map<std::string, bool> requires_grad;
  std::map<std::string, bool> training;          // "" is the model itself
};

ModelState state_of(const torch::nn::Module& model) {
  ModelState s;
  for (const auto& p : model.named_parameters()) {
    s.values[p.key()] = p.value().detach().clone();
    s.grads[p.key()] = p.value().grad().defined() ? p.value().grad().clone() : torch::Tensor();
    s.requires_grad[p.key()] = p.value().requires_grad();
  }
  for (const auto& b : model.named_buffers()) s.values[b.key()] = b.value().detach().clone();
  for (const auto& m : model.named_modules()) s.training[m.key()] = m.value()->is_training();
  return s;
}

// Bit for bit: same dtype, shape and bytes (torch::equal also checks dtype and shape).
void expect_same(const ModelState& after, const ModelState& before, const std::string& what) {
  ASSERT_EQ(after.values.size(), before.values.size()) << what;
  for (const auto& [name, value] : before.values) {
    EXPECT_TRUE(torch::equal(after.values.at(name), value)) << what << ": " << name << " changed";
  }
  for (const auto& [name, grad] : before.grads) {
    const auto& now = after.grads.at(name);
    ASSERT_EQ(now.defined(), grad.defined()) << what << ": gradient of " << name;
    if (grad.defined()) {
      EXPECT_TRUE(torch::equal(now, grad)) << what << ": gradient of " << name;
    }
  }
  EXPECT_EQ(after.requires_grad, before.requires_grad) << what;
  EXPECT_EQ(after.training, before.training) << what;
}

// Gives some parameters a gradient (others keep none) and freezes one, so both kinds of grad
// and both requires_grad values are checked.
void prepare_grads(torch::nn::Module& model) {
  auto params = model.parameters();
  ASSERT_GE(params.size(), 3u);
  params[0].mutable_grad() = torch::full_like(params[0], 0.25);
  params[2].mutable_grad() = torch::arange(params[2].numel(), torch::kFloat).view_as(params[2]);
  params.back().requires_grad_(false);
}

TimeProfileOptions quick() {
  TimeProfileOptions options;
  options.budget = std::chrono::milliseconds(1);
  return options;
}

// Both balances, then the model and the default generator must be as before.
void expect_untouched_by_profiling(const torch::nn::Sequential& model, const Batch& sample) {
  const ModelState before = state_of(*model);
  const torch::Tensor grad0 = model->parameters()[0].grad();
  torch::manual_seed(11);
  balance_by_time(2, model, sample, quick());
  expect_same(state_of(*model), before, "after balance_by_time");
  balance_by_size(2, model, sample);
  expect_same(state_of(*model), before, "after balance_by_size");
  // The user's gradient tensor is the same object, not a copy of it.
  EXPECT_TRUE(model->parameters()[0].grad().is_same(grad0));
  const torch::Tensor drawn = torch::rand({4});
  torch::manual_seed(11);
  EXPECT_TRUE(torch::equal(drawn, torch::rand({4}))) << "profiling moved the default generator";
}

TEST(Profiling, LeavesACloneableModelUnchanged) {
  torch::manual_seed(1);
  torch::nn::Functional squash([](torch::Tensor x) { return torch::tanh(x); });
  EXPECT_NO_THROW(squash->clone()) << "Functional is Cloneable: profiled as a copy";
  torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::BatchNorm1d(32), torch::nn::ReLU(),
                              torch::nn::Dropout(0.5), squash, torch::nn::Linear(32, 4));
  prepare_grads(*model);
  // Mixed flags: the model in eval mode but its BatchNorm training, whose statistics a forward
  // in training mode would move.
  model->eval();
  model[1]->train(true);
  expect_untouched_by_profiling(model, Batch(torch::randn({6, 8})));
  model->train();
  expect_untouched_by_profiling(model, Batch(torch::randn({6, 8})));
}

// A custom block that is a plain torch::nn::Module: clone() throws, so profiling runs the block
// itself and must put its state back.
struct NormBlockImpl : torch::nn::Module {
  NormBlockImpl(int64_t in, int64_t out)
      : linear(register_module("linear", torch::nn::Linear(in, out))),
        norm(register_module("norm", torch::nn::BatchNorm1d(out))) {}
  torch::Tensor forward(torch::Tensor x) {
    auto y = norm(linear(x));
    if (fail) throw std::runtime_error("NormBlock failed on purpose");
    return y;
  }
  torch::nn::Linear linear;
  torch::nn::BatchNorm1d norm;
  bool fail = false;
};
TORCH_MODULE(NormBlock);

TEST(Profiling, LeavesALayerThatCannotBeClonedUnchanged) {
  torch::manual_seed(2);
  NormBlock first(8, 16), last(16, 4);
  EXPECT_THROW(first->clone(), c10::Error) << "the fallback needs a layer that cannot be cloned";
  torch::nn::Sequential model(first, torch::nn::ReLU(), torch::nn::Dropout(0.2), last);
  prepare_grads(*model);
  model->eval();
  expect_untouched_by_profiling(model, Batch(torch::randn({5, 8})));
  model->train();
  last->eval();  // only the inner layer's flag differs from the model's
  expect_untouched_by_profiling(model, Batch(torch::randn({5, 8})));
}

TEST(Profiling, PutsTheStateBackWhenALayerThrows) {
  torch::manual_seed(3);
  NormBlock block(4, 4);
  torch::nn::Sequential model(torch::nn::Linear(4, 4), block);
  prepare_grads(*model);
  model->eval();
  const ModelState before = state_of(*model);
  block->fail = true;  // after its BatchNorm has moved the running statistics
  EXPECT_THROW(size_costs(model, Batch(torch::randn({3, 4}))), std::runtime_error);
  EXPECT_THROW(time_costs(model, Batch(torch::randn({3, 4})), quick()), std::runtime_error);
  expect_same(state_of(*model), before, "after a failed profile");
}

// Layers that change the shape, and one that returns a tuple to a layer that takes one.
struct SplitImpl : torch::nn::Cloneable<SplitImpl> {
  void reset() override {}
  std::vector<torch::Tensor> forward(torch::Tensor x) { return {x, x.sum(-1) > 0}; }
};
TORCH_MODULE(Split);

struct GateImpl : torch::nn::Cloneable<GateImpl> {
  void reset() override {}
  torch::Tensor forward(std::vector<torch::Tensor> xs) {
    return xs.at(0) * xs.at(1).unsqueeze(-1).to(xs.at(0).dtype());
  }
};
TORCH_MODULE(Gate);

TEST(Profiling, ShapeChangesAndTuples) {
  torch::manual_seed(4);
  torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::Linear(32, 4), torch::nn::Flatten(), Split(),
                              Gate());
  const Batch sample(torch::randn({3, 2, 8}));
  const double f = 4;  // bytes per float
  const auto sizes = size_costs(model, sample, /*param_scale=*/2.0);
  EXPECT_EQ(sizes, (std::vector<double>{2 * (8 * 32 + 32) * f + 3 * 2 * 32 * f,  // [3, 2, 32]
                                        2 * (32 * 4 + 4) * f + 3 * 2 * 4 * f,    // [3, 2, 4]
                                        3 * 8 * f,                               // flattened [3, 8]
                                        3 * 8 * f + 3,                           // ([3, 8], Bool[3])
                                        3 * 8 * f}));
  const auto times = time_costs(model, sample, quick());
  ASSERT_EQ(times.size(), 5u);
  for (double t : times) EXPECT_GT(t, 0.0);
  EXPECT_EQ(balance_by_size(2, model, sample), (std::vector<int64_t>{1, 4}));
}

// A skippable layer that stashes a computed tensor: its graph is freed by the stashing layer's
// own backward, so the popping layer's backward must stop at the pop.
TEST(Profiling, PoppedTensorsAreDetached) {
  skip::Skippable twice(std::vector<std::string>{"t"}, std::vector<std::string>{},
                        [](const torch::Tensor& x, skip::Skips& s) {
                          auto y = torch::tanh(x);  // keeps its result for backward
                          s.stash("t", y);
                          return y;
                        }, "Twice");
  torch::nn::Sequential model(torch::nn::Linear(4, 4), twice, torch::nn::Linear(4, 4), skip::pop_add("t"));
  const Batch sample(torch::randn({2, 4}));
  EXPECT_EQ(time_costs(model, sample, quick()).size(), 4u);
  EXPECT_EQ(size_costs(model, sample).size(), 4u);
}

}  // namespace
}  // namespace pipetrain
