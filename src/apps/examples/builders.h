// The constructors behind make_example, one per file (cnn.cpp, gpt.cpp, mlp.cpp).
#pragma once

#include "apps/examples/example.h"

namespace pipetrain::examples::detail {

Example make_cnn(const ExampleOptions& options);
Example make_gpt(const ExampleOptions& options);
Example make_mlp(const ExampleOptions& options);

// Overrides `defaults` with the non-zero fields of `options`; ConfigError for negative ones.
void apply_options(const ExampleOptions& options, TrainDefaults& defaults);

}  // namespace pipetrain::examples::detail
