// The per-layer profile: bytes against hand counts, times present, the fast path's B/W split.
#include "pipetrain/runtime/layer_profile.h"

#include <gtest/gtest.h>

#include "pipetrain/error.h"
#include "pipetrain/skip/skippable.h"

namespace pipetrain::runtime {
namespace {

std::vector<LayerSpec> small_mlp() {
  return {LayerSpec::of<torch::nn::Linear>("Linear", 16, 32), LayerSpec::of<torch::nn::ReLU>("ReLU"),
          LayerSpec::of<torch::nn::Linear>("Linear", 32, 8)};
}

TEST(LayerProfile, BytesMatchTheShapesAndEveryPhaseIsTimed) {
  LayerProfileOptions options;
  options.budget = std::chrono::milliseconds(5);
  const auto profile = profile_layers(small_mlp(), Batch(torch::randn({4, 16})), options);
  ASSERT_EQ(profile.layers.size(), 3u);
  EXPECT_EQ(profile.rows, 4);
  EXPECT_EQ(profile.input_bytes, 4 * 16 * 4);
  EXPECT_EQ(profile.layers[0].param_bytes, (16 * 32 + 32) * 4);
  EXPECT_EQ(profile.layers[1].param_bytes, 0);
  EXPECT_EQ(profile.layers[2].param_bytes, (32 * 8 + 8) * 4);
  EXPECT_EQ(profile.layers[0].output_bytes, 4 * 32 * 4);
  EXPECT_EQ(profile.layers[2].output_bytes, 4 * 8 * 4);
  // What the forwards leave for backward: at least the ReLU's result (read by its backward and
  // kept by the next Linear for its weight gradient). Bytes are counted where they stay alive:
  // the first Linear's output, replaced by the ReLU's, is counted once, at one of the two.
  double kept = 0;
  for (const auto& l : profile.layers) kept += l.activation_bytes;
  EXPECT_GE(kept, 4 * 32 * 4);
  // What a step leaves behind: at least the gradients, for the layers with parameters.
  EXPECT_GE(profile.layers[0].state_bytes, profile.layers[0].param_bytes);
  EXPECT_EQ(profile.layers[1].state_bytes, 0);
  for (const auto& l : profile.layers) {
    EXPECT_GT(l.forward_s, 0);
    EXPECT_GT(l.backward_input_s, 0);
  }
  // The Linear fast path computes weight gradients apart, as a stage does; ReLU has none.
  EXPECT_GT(profile.layers[0].backward_weight_s, 0);
  EXPECT_EQ(profile.layers[1].backward_weight_s, 0);
  EXPECT_GT(profile.layers[0].optimizer_s, 0);
  EXPECT_EQ(profile.layers[1].optimizer_s, 0);
}

TEST(LayerProfile, AModelWithSkipsIsAConfigError) {
  std::vector<LayerSpec> specs{LayerSpec::skippable("stash", "Stash", [] { return torch::nn::AnyModule(skip::stash("x")); },
                                                    skip::SkipDeclaration::of({"x"}, {})),
                               LayerSpec::skippable("pop", "Pop", [] { return torch::nn::AnyModule(skip::pop_add("x")); },
                                                    skip::SkipDeclaration::of({}, {"x"}))};
  EXPECT_THROW(profile_layers(specs, Batch(torch::randn({2, 4}))), ConfigError);
}

}  // namespace
}  // namespace pipetrain::runtime
