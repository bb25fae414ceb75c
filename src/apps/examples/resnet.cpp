// A ResNet-style network on Fashion-MNIST whose skips cross pipeline stages: two residual
// blocks (each skip spans 6 layers) and a long skip from the stem to the head.
#include "apps/examples/builders.h"
#include "apps/examples/vision_layers.h"

namespace pipetrain::examples::detail {
namespace {

// The head's input: the last block's features [B, 32, 7, 7] with the stem's [B, 16, 28, 28]
// pooled to 7 x 7 beside them.
skip::Skippable join_stem() {
  return skip::Skippable(std::vector<std::string>{}, std::vector<std::string>{"stem"},
                         [](const torch::Tensor& x, skip::Skips& s) {
                           auto stem = torch::adaptive_avg_pool2d(s.pop("stem"), {x.size(2), x.size(3)});
                           return torch::cat({x, stem}, 1);
                         },
                         "JoinStem");
}

// conv-bn-relu-conv-bn around a residual skip named `name`, then relu.
void residual_block(std::vector<LayerSpec>& layers, const std::string& name, int64_t channels) {
  layers.push_back(skip_spec("stash(" + name + ")", [name] { return skip::stash(name); }));
  layers.push_back(conv_spec(channels, channels));
  layers.push_back(batch_norm_spec(channels));
  layers.push_back(relu_spec());
  layers.push_back(conv_spec(channels, channels));
  layers.push_back(batch_norm_spec(channels));
  layers.push_back(skip_spec("pop_add(" + name + ")", [name] { return skip::pop_add(name); }));
  layers.push_back(relu_spec());
}

std::vector<LayerSpec> resnet_layers() {
  std::vector<LayerSpec> layers{conv_spec(1, 16), batch_norm_spec(16), relu_spec(),  // [B, 16, 28, 28]
                                skip_spec("stash(stem)", [] { return skip::stash("stem"); })};
  residual_block(layers, "block1", 16);
  layers.push_back(max_pool_spec());  // [B, 16, 14, 14]
  layers.push_back(conv_spec(16, 32));
  layers.push_back(batch_norm_spec(32));
  layers.push_back(relu_spec());
  residual_block(layers, "block2", 32);
  layers.push_back(max_pool_spec());  // [B, 32, 7, 7]
  layers.push_back(skip_spec("join(stem)", [] { return join_stem(); }));  // [B, 48, 7, 7]
  layers.push_back(flatten_spec());
  layers.push_back(linear_spec(48 * 7 * 7, 128));
  layers.push_back(relu_spec());
  layers.push_back(linear_spec(128, data::kFashionMnistClasses));
  return layers;
}

}  // namespace

Example make_resnet(const ExampleOptions& options) {
  return make_fashion_mnist_example(
      "resnet",
      "ResNet-style network on Fashion-MNIST (2 residual blocks and a long stem-to-head skip that cross "
      "stages; 30 layers)",
      resnet_layers(), options);
}

}  // namespace pipetrain::examples::detail
