// The default example: a small convolutional network on Fashion-MNIST.
#include "apps/examples/builders.h"
#include "apps/examples/vision_layers.h"

namespace pipetrain::examples::detail {

Example make_cnn(const ExampleOptions& options) {
  return make_fashion_mnist_example(
      "cnn", "convolutional network on Fashion-MNIST (2 x conv-bn-relu-pool, 2 linear; 12 layers)",
      {
          conv_spec(1, 32),
          batch_norm_spec(32),
          relu_spec(),
          max_pool_spec(),  // [B, 32, 14, 14]
          conv_spec(32, 64),
          batch_norm_spec(64),
          relu_spec(),
          max_pool_spec(),  // [B, 64, 7, 7]
          flatten_spec(),
          linear_spec(64 * 7 * 7, 128),
          relu_spec(),
          linear_spec(128, data::kFashionMnistClasses),  // logits [B, 10]
      },
      options);
}

}  // namespace pipetrain::examples::detail
