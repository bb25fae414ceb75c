// Checkpointing keeps less: the storage a forward leaves alive, counted per checkpoint mode.
#include <gtest/gtest.h>

#include "gpipe_support.h"
#include "pipetrain/engine/gpipe.h"
#include "pipetrain/runtime/allocation_counter.h"

namespace pipetrain {
namespace {

torch::nn::Sequential deep_mlp() {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int k = 0; k < 8; ++k) {
    model->push_back(torch::nn::Linear(64, 64));
    model->push_back(torch::nn::ReLU());
  }
  // Ends in a Linear, which does not keep its output: the output is then the only thing the
  // gathered result copies.
  model->push_back(torch::nn::Linear(64, 64));
  return model;
}

int64_t saved_bytes(const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                    const torch::Tensor& x) {
  runtime::AllocationCounter counter;
  const torch::Tensor out = forward(x);
  return counter.live_bytes() - static_cast<int64_t>(out.nbytes());
}

TEST(GPipeMemory, CheckpointModesKeepLessThanNoCheckpointing) {
  const torch::Tensor x = torch::randn({64, 64});
  auto plain = deep_mlp();
  const int64_t plain_bytes = saved_bytes([&](const torch::Tensor& t) { return plain->forward(t); }, x);
  std::map<Checkpoint, int64_t> bytes;
  for (Checkpoint mode : {Checkpoint::Never, Checkpoint::ExceptLast, Checkpoint::Always}) {
    GPipe gpipe(deep_mlp(), GPipeOptions({8, 9}).chunks(4).checkpoint(mode));
    bytes[mode] = saved_bytes([&](const torch::Tensor& t) { return gpipe->forward(t); }, x);
  }
  // Without checkpointing the pipeline keeps what the plain model keeps: per ReLU, one
  // activation of 64 x 64 floats (ReLU's output is also the next Linear's saved input).
  EXPECT_EQ(plain_bytes, 8 * 64 * 64 * 4);
  EXPECT_EQ(bytes[Checkpoint::Never], plain_bytes);
  EXPECT_LT(bytes[Checkpoint::ExceptLast], bytes[Checkpoint::Never]);
  EXPECT_LT(bytes[Checkpoint::Always], bytes[Checkpoint::ExceptLast]);
  // Always keeps only the second partition's inputs: one activation per micro-batch.
  EXPECT_LE(bytes[Checkpoint::Always], 64 * 64 * 4 + 4096);
}

}  // namespace
}  // namespace pipetrain
