// GPipe with skip connections: the oracle (loss and every gradient equal the plain model's) for
// skips inside one partition, across one and across several, with each checkpoint mode; and
// for optional skips (an undefined tensor stashed on some calls or on all).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpipe_support.h"
#include "pipetrain/engine/gpipe.h"
#include "pipetrain/error.h"
#include "pipetrain/skip/skippable.h"

namespace pipetrain {
namespace {

using testing::deep_copy;
using testing::expect_close;
using testing::grads;

// 0 Linear  1 stash(a)  2 Tanh  3 Linear  4 stash(b)  5 ReLU  6 pop_add(b)  7 Linear
// 8 pop_cat(a)  9 Linear: a skips 6 layers, b skips 1.
torch::nn::Sequential skip_model() {
  return torch::nn::Sequential(torch::nn::Linear(8, 12), skip::stash("a"), torch::nn::Tanh(),
                               torch::nn::Linear(12, 12), skip::stash("b"), torch::nn::ReLU(), skip::pop_add("b"),
                               torch::nn::Linear(12, 12), skip::pop_cat("a"), torch::nn::Linear(24, 4));
}

struct Case {
  std::vector<int64_t> balance;
  int64_t chunks;
  Checkpoint checkpoint;
};

std::string name_of(const Case& c) {
  std::string out = "balance";
  for (auto b : c.balance) out += std::to_string(b);
  return out + "_chunks" + std::to_string(c.chunks) + "_" + to_string(c.checkpoint);
}

class SkipTransparency : public ::testing::TestWithParam<Case> {};

// `model` through GPipe with the case's balance, chunks and checkpoint mode on input `x` (a
// leaf) gives the plain run's loss, parameter gradients and input gradient.
template <typename C>
void expect_gpipe_matches(const torch::nn::Sequential& model, const C& c, const torch::Tensor& x,
                          const torch::Tensor& y, const torch::Tensor& plain_loss,
                          const std::vector<torch::Tensor>& plain_grads, const torch::Tensor& plain_input_grad,
                          const std::string& name) {
  GPipe gpipe(model, GPipeOptions(c.balance).chunks(c.chunks).checkpoint(c.checkpoint));
  const torch::Tensor loss = torch::mse_loss(gpipe->forward(x), y);
  loss.backward();

  EXPECT_TRUE(torch::allclose(loss, plain_loss, 1e-6, 1e-7)) << loss.item<double>() << " vs " << plain_loss.item<double>();
  expect_close(grads(*gpipe), plain_grads, name);
  expect_close({x.grad()}, {plain_input_grad}, name + " input gradient");
}

TEST_P(SkipTransparency, LossAndGradientsEqualThePlainModel) {
  const Case& c = GetParam();
  torch::manual_seed(3);
  auto model = skip_model();
  auto plain = deep_copy(model);
  const torch::Tensor x = torch::randn({12, 8});
  const torch::Tensor y = torch::randn({12, 4});
  torch::Tensor x1 = x.clone().requires_grad_(true), x2 = x.clone().requires_grad_(true);

  const torch::Tensor plain_loss = torch::mse_loss(plain->forward(x1), y);
  plain_loss.backward();

  expect_gpipe_matches(model, c, x2, y, plain_loss, grads(*plain), x1.grad(), name_of(c));
}

std::vector<Case> cases() {
  std::vector<Case> out;
  // {10}: no partition boundary; {4,3,3}: b inside partition 1, a across 2 boundaries;
  // {5,5}: both across 1; {2,8}: a partition ending in a stash layer; {2,2,2,2,2}: a across 4.
  for (std::vector<int64_t> balance : {std::vector<int64_t>{10}, {4, 3, 3}, {5, 5}, {2, 8}, {2, 2, 2, 2, 2}}) {
    for (int64_t chunks : {1, 3}) {
      for (Checkpoint mode : {Checkpoint::Always, Checkpoint::ExceptLast, Checkpoint::Never}) {
        out.push_back({balance, chunks, mode});
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(GPipe, SkipTransparency, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return name_of(info.param); });

TEST(GPipeSkips, TensorsArriveIntact) {
  std::vector<torch::Tensor> stashed, popped;
  skip::Skippable keep(std::vector<std::string>{"s"}, std::vector<std::string>{},
                       [&](const torch::Tensor& x, skip::Skips& s) {
                         if (!is_recomputing()) stashed.push_back(x.detach().clone());
                         s.stash("s", x * 2);
                         return x;
                       }, "Keep");
  skip::Skippable take(std::vector<std::string>{}, std::vector<std::string>{"s"},
                       [&](const torch::Tensor& x, skip::Skips& s) {
                         auto t = s.pop("s");
                         if (!is_recomputing()) popped.push_back(t.detach().clone());
                         return x + t;
                       }, "Take");
  torch::manual_seed(4);
  torch::nn::Sequential model(keep, torch::nn::Linear(5, 5), torch::nn::Linear(5, 5), take);
  GPipe gpipe(model, GPipeOptions({1, 1, 2}).chunks(4).checkpoint(Checkpoint::Always));
  auto x = torch::randn({8, 5});
  gpipe->forward(x).sum().backward();
  ASSERT_EQ(stashed.size(), 4u);
  ASSERT_EQ(popped.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(torch::equal(popped[i], stashed[i] * 2)) << "micro-batch " << i;
    EXPECT_TRUE(torch::equal(stashed[i], x.slice(0, 2 * static_cast<int64_t>(i), 2 * static_cast<int64_t>(i) + 2)));
  }
}

TEST(GPipeSkips, EvaluationWithoutGradients) {
  torch::manual_seed(5);
  auto model = skip_model();
  auto plain = deep_copy(model);
  GPipe gpipe(model, GPipeOptions({3, 3, 4}).chunks(4));
  gpipe->eval();
  plain->eval();
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({10, 8});
  EXPECT_TRUE(torch::allclose(gpipe->forward(x), plain->forward(x), 1e-6, 1e-7));
}

TEST(GPipeSkips, NamespacedBlocksRepeat) {
  skip::Namespace first, second;
  torch::manual_seed(6);
  torch::nn::Sequential model;
  for (const auto* ns : {&first, &second}) {
    model->push_back(skip::stash("x", *ns));
    model->push_back(torch::nn::Linear(6, 6));
    model->push_back(skip::pop_add("x", *ns));
  }
  auto plain = deep_copy(model);
  GPipe gpipe(model, GPipeOptions({2, 2, 2}).chunks(2));
  const auto x = torch::randn({4, 6});
  plain->forward(x).square().sum().backward();
  gpipe->forward(x).square().sum().backward();
  expect_close(grads(*gpipe), grads(*plain), "namespaced blocks");
}

TEST(GPipeSkips, AStashThatDoesNotHappenIsNamed) {
  skip::Skippable forgetful(std::vector<std::string>{"s"}, std::vector<std::string>{},
                            [](const torch::Tensor& x, skip::Skips&) { return x; }, "Forgetful");
  torch::nn::Sequential model(forgetful, torch::nn::Linear(3, 3), skip::pop_add("s"));
  for (Checkpoint mode : {Checkpoint::Always, Checkpoint::Never}) {
    GPipe gpipe(model, GPipeOptions({1, 2}).chunks(2).checkpoint(mode));
    try {
      gpipe->forward(torch::ones({4, 3}));
      FAIL() << "a declared stash that never happened";
    } catch (const ModuleError& e) {
      // The layer's own check (torchgpipe's message), before the pipeline misses the tensor.
      EXPECT_THAT(std::string(e.what()), ::testing::AllOf(::testing::HasSubstr("'s' must be stashed but have not"),
                                                          ::testing::HasSubstr("layer Forgetful")));
    }
  }
}

TEST(GPipeSkips, BadDeclarationFailsAtConstruction) {
  torch::nn::Sequential model(torch::nn::Linear(4, 4), skip::pop_add("late"), skip::stash("late"), torch::nn::Linear(4, 4));
  try {
    GPipe gpipe(model, GPipeOptions({2, 2}));
    FAIL() << "a pop before its stash";
  } catch (const ModuleError& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("layer 1 (PopAdd) pops skip 'late' before layer 2 (Stash)"));
  }
}

// --- optional skips (torchgpipe's None) ----------------------------------------------------

// When an optional skip is stashed: on every call, on none, or on the calls whose input starts
// with a positive number (the test makes micro-batches 0 and 2 of three positive there).
enum class Presence { Always, Never, Mixed };

std::string to_string(Presence p) {
  return p == Presence::Always ? "always" : p == Presence::Never ? "never" : "mixed";
}

bool stashes(Presence p, const torch::Tensor& x) {
  if (p == Presence::Mixed) return x[0][0].item<float>() > 0;
  return p == Presence::Always;
}

// Identity that stashes tanh(x) * 2 under `name`, or an undefined tensor.
skip::Skippable optional_stash(const std::string& name, Presence p) {
  return skip::Skippable(std::vector<std::string>{name}, std::vector<std::string>{},
                         [name, p](const torch::Tensor& x, skip::Skips& s) {
                           s.stash(name, stashes(p, x) ? torch::tanh(x) * 2 : torch::Tensor());
                           return x;
                         }, "OptionalStash");
}

// 0 stash(a)?  1 Linear  2 Tanh  3 Linear  4 stash(b)?  5 ReLU  6 pop_add(b)  7 Linear
// 8 pop_add(a)  9 Linear: a decides on the mini-batch's input (so the input gradient shows
// whether it flowed), b on an activation; pop_add adds nothing for an undefined tensor.
torch::nn::Sequential optional_model(Presence a, Presence b) {
  return torch::nn::Sequential(optional_stash("a", a), torch::nn::Linear(8, 8), torch::nn::Tanh(),
                               torch::nn::Linear(8, 8), optional_stash("b", b), torch::nn::ReLU(),
                               skip::pop_add("b"), torch::nn::Linear(8, 8), skip::pop_add("a"),
                               torch::nn::Linear(8, 4));
}

struct OptionalCase {
  std::vector<int64_t> balance;
  int64_t chunks;
  Checkpoint checkpoint;
  Presence a, b;
};

std::string name_of(const OptionalCase& c) {
  return name_of(Case{c.balance, c.chunks, c.checkpoint}) + "_a_" + to_string(c.a) + "_b_" + to_string(c.b);
}

class OptionalSkipTransparency : public ::testing::TestWithParam<OptionalCase> {};

// The oracle runs the plain model on each micro-batch in turn (an optional skip decides per
// call, so the pipelined model must see the same calls) and concatenates the outputs.
TEST_P(OptionalSkipTransparency, LossAndGradientsEqualThePlainModel) {
  const OptionalCase& c = GetParam();
  torch::manual_seed(7);
  auto model = optional_model(c.a, c.b);
  auto plain = deep_copy(model);
  torch::Tensor x = torch::randn({12, 8});
  for (int64_t row = 0; row < 12; row += 4) x[row][0] = (row == 4 ? -1.0 : 1.0) * (0.5 + x[row][0].abs());
  const torch::Tensor y = torch::randn({12, 4});
  torch::Tensor x1 = x.clone().requires_grad_(true), x2 = x.clone().requires_grad_(true);

  std::vector<torch::Tensor> outs;
  for (const auto& part : x1.chunk(c.chunks)) outs.push_back(plain->forward(part));
  const torch::Tensor plain_loss = torch::mse_loss(torch::cat(outs), y);
  plain_loss.backward();

  expect_gpipe_matches(model, c, x2, y, plain_loss, grads(*plain), x1.grad(), name_of(c));
}

std::vector<OptionalCase> optional_cases() {
  std::vector<OptionalCase> out;
  // {10}: no boundary; {5,5}: a and b across one; {2,8}: a across one, b inside;
  // {1,4,5}: a's stash alone in partition 0; {2,2,2,2,2}: a across four, b across one.
  for (std::vector<int64_t> balance : {std::vector<int64_t>{10}, {5, 5}, {2, 8}, {1, 4, 5}, {2, 2, 2, 2, 2}}) {
    for (int64_t chunks : {1, 3}) {
      for (Checkpoint mode : {Checkpoint::Always, Checkpoint::ExceptLast, Checkpoint::Never}) {
        out.push_back({balance, chunks, mode, Presence::Mixed, Presence::Never});
        out.push_back({balance, chunks, mode, Presence::Never, Presence::Always});
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(GPipe, OptionalSkipTransparency, ::testing::ValuesIn(optional_cases()),
                         [](const auto& info) { return name_of(info.param); });

TEST(GPipeSkips, AnOptionalSkipMustNotChangeOnRecomputation) {
  // Stashes at forward, stashes nothing when recomputed: the checkpoint's outputs would not
  // line up with the gradients it gets.
  skip::Skippable fickle(std::vector<std::string>{"s"}, std::vector<std::string>{},
                         [](const torch::Tensor& x, skip::Skips& s) {
                           s.stash("s", is_recomputing() ? torch::Tensor() : x * 2);
                           return x;
                         }, "Fickle");
  torch::nn::Sequential model(torch::nn::Linear(3, 3), fickle, torch::nn::Linear(3, 3), skip::pop_add("s"));
  GPipe gpipe(model, GPipeOptions({2, 2}).chunks(2).checkpoint(Checkpoint::Always));
  const auto out = gpipe->forward(torch::randn({4, 3}));
  try {
    out.sum().backward();
    FAIL() << "a stash that differs on recomputation";
  } catch (const ModuleError& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("layer 1 stashed an undefined tensor under skip 's' when "
                                                            "recomputed in backward but a tensor in its forward"));
  }
}

}  // namespace
}  // namespace pipetrain
