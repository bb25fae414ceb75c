// The constructors behind make_example, one per file (cnn.cpp, gpt.cpp, mlp.cpp, resnet.cpp).
#pragma once

#include "apps/examples/example.h"

namespace pipetrain::examples::detail {

Example make_cnn(const ExampleOptions& options);
Example make_gpt(const ExampleOptions& options);
Example make_mlp(const ExampleOptions& options);
Example make_resnet(const ExampleOptions& options);

// An image classifier on Fashion-MNIST with these layers (cnn, resnet): data sharded by
// replica, evaluation on the test set, cross-entropy and accuracy, Adam.
Example make_fashion_mnist_example(std::string name, std::string description, std::vector<LayerSpec> layers,
                                   const ExampleOptions& options);

// Overrides `defaults` with the non-zero fields of `options`; ConfigError for negative ones.
void apply_options(const ExampleOptions& options, TrainDefaults& defaults);

}  // namespace pipetrain::examples::detail
