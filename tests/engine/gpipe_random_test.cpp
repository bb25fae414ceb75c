// Dropout under GPipe: masks follow the task generators, recomputation repeats them exactly.
#include <gtest/gtest.h>

#include "gpipe_support.h"
#include "pipetrain/engine/gpipe.h"
#include <ATen/CPUGeneratorImpl.h>

#include "pipetrain/runtime/dropout.h"

namespace pipetrain {
namespace {

torch::nn::Sequential dropout_model() {
  return torch::nn::Sequential(torch::nn::Dropout(0.5), torch::nn::Dropout(0.3),
                               torch::nn::Dropout(0.5), torch::nn::Dropout(0.2));
}

TEST(GPipeDropout, ConvertsTorchDropout) {
  GPipe gpipe(dropout_model(), GPipeOptions({2, 2}));
  EXPECT_NE((*gpipe)[0]->as<runtime::DropoutImpl>(), nullptr);
  EXPECT_DOUBLE_EQ((*gpipe)[1]->as<runtime::DropoutImpl>()->options.p(), 0.3);
}

TEST(GPipeDropout, AlwaysCheckpointingOutputZerosEqualInputGradientZeros) {
  for (int64_t chunks : {1, 3, 8}) {
    torch::manual_seed(chunks);
    GPipe gpipe(dropout_model(),
                GPipeOptions({2, 2}).chunks(chunks).checkpoint(Checkpoint::Always));
    torch::Tensor x = torch::ones({16, 64}, torch::requires_grad());
    const torch::Tensor out = gpipe->forward(x);
    torch::randn({100});  // the default generator moves on before backward
    out.backward(torch::ones_like(out));
    const torch::Tensor out_zero = out.detach() == 0;
    EXPECT_GT(out_zero.sum().item<int64_t>(), 0);
    EXPECT_TRUE(torch::equal(out_zero, x.grad() == 0)) << "chunks " << chunks;
    // With an all-ones input and gradient, both are the product of the scaled masks.
    EXPECT_TRUE(torch::allclose(out.detach(), x.grad())) << "chunks " << chunks;
  }
}

TEST(GPipeDropout, MasksRepeatForTheSameSeedWhateverTheTiming) {
  auto run = [] {
    torch::manual_seed(11);
    GPipe gpipe(dropout_model(), GPipeOptions({1, 1, 1, 1}).chunks(4));
    return gpipe->forward(torch::ones({16, 32}));
  };
  const torch::Tensor first = run();
  for (int k = 0; k < 3; ++k) EXPECT_TRUE(torch::equal(first, run()));
}

TEST(GPipeDropout, EvalModeIsTheIdentity) {
  GPipe gpipe(dropout_model(), GPipeOptions({2, 2}).chunks(2));
  gpipe->eval();
  const torch::Tensor x = torch::randn({4, 5});
  EXPECT_TRUE(torch::equal(gpipe->forward(x), x));
}

// Random ops that runtime::Dropout does not replace: a Dropout inside a custom module,
// torch::dropout in a Functional, torch::rand_like in a Functional. Each multiplies its input
// by a random factor, so with an all-ones input and output gradient the input gradient equals
// the output exactly when recomputation draws what the forward drew.
struct NestedDropoutImpl : torch::nn::Module {
  NestedDropoutImpl() { drop = register_module("drop", torch::nn::Dropout(0.4)); }
  torch::Tensor forward(torch::Tensor x) { return drop(x); }
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(NestedDropout);

torch::nn::Sequential unconverted_random_model() {
  return torch::nn::Sequential(
      NestedDropout(), torch::nn::Functional([](torch::Tensor x) { return torch::dropout(x, 0.3, true); }),
      torch::nn::Functional([](torch::Tensor x) { return x * (torch::rand_like(x) + 0.5); }), NestedDropout());
}

TEST(GPipeRandomOps, RecomputationRepeatsEveryRandomOpInEveryCheckpointMode) {
  for (Checkpoint mode : {Checkpoint::Always, Checkpoint::ExceptLast, Checkpoint::Never}) {
    for (int64_t chunks : {1, 4}) {
      torch::manual_seed(chunks);
      GPipe gpipe(unconverted_random_model(), GPipeOptions({2, 2}).chunks(chunks).checkpoint(mode));
      for (int step = 0; step < 2; ++step) {  // the second step runs with the learned leases
        torch::Tensor x = torch::ones({16, 64}, torch::requires_grad());
        const torch::Tensor out = gpipe->forward(x);
        torch::randn({100});  // the default generator moves on before backward
        out.backward(torch::ones_like(out));
        EXPECT_GT((out.detach() == 0).sum().item<int64_t>(), 0);
        EXPECT_TRUE(torch::allclose(out.detach(), x.grad(), 1e-6, 0))
            << to_string(mode) << ", chunks " << chunks << ", step " << step;
      }
    }
  }
}

TEST(GPipeRandomOps, DrawsRepeatForTheSameSeedWhateverTheTiming) {
  auto run = [] {
    torch::manual_seed(5);
    GPipe gpipe(unconverted_random_model(), GPipeOptions({1, 1, 1, 1}).chunks(4));
    std::vector<torch::Tensor> outs;
    for (int k = 0; k < 2; ++k) outs.push_back(gpipe->forward(torch::ones({16, 32})).detach());
    return torch::cat(outs);
  };
  const torch::Tensor first = run();
  for (int k = 0; k < 3; ++k) EXPECT_TRUE(torch::equal(first, run()));
}

// A partition that draws nothing runs free after its first task: partitions stay concurrent
// (GPipeConcurrency.SleepingPartitionsOverlap), and the pipeline's own draws stay apart
// from a user's draws from the default generator.
TEST(GPipeRandomOps, TheDefaultGeneratorMovesOnlyForTheSeed) {
  torch::manual_seed(3);
  GPipe gpipe(unconverted_random_model(), GPipeOptions({2, 2}).chunks(2));
  gpipe->forward(torch::ones({4, 8}));
  const auto after_one = torch::randn({3});
  torch::manual_seed(3);
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  {  // the one draw a forward takes: its seed
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.get<at::CPUGeneratorImpl>()->random64();
  }
  EXPECT_TRUE(torch::equal(after_one, torch::randn({3})));
}

TEST(GPipeDropout, ConversionCanBeTurnedOff) {
  GPipe gpipe(dropout_model(), GPipeOptions({2, 2}).convert_dropout(false));
  EXPECT_NE((*gpipe)[0]->as<torch::nn::DropoutImpl>(), nullptr);
}

}  // namespace
}  // namespace pipetrain
