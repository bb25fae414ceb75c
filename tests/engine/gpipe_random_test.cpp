// Dropout under GPipe: masks follow the task generators, recomputation repeats them exactly.
#include <gtest/gtest.h>

#include "gpipe_support.h"
#include "pipetrain/engine/gpipe.h"
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

TEST(GPipeDropout, ConversionCanBeTurnedOff) {
  GPipe gpipe(dropout_model(), GPipeOptions({2, 2}).convert_dropout(false));
  EXPECT_NE((*gpipe)[0]->as<torch::nn::DropoutImpl>(), nullptr);
}

}  // namespace
}  // namespace pipetrain
