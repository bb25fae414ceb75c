// Dropout that draws its mask from the current task generator (runtime/rng.h), so that a
// pipeline's concurrent workers and checkpoint recomputation reproduce masks exactly.
#pragma once

#include <torch/torch.h>

namespace pipetrain::runtime {

// Same behaviour and options as torch::nn::Dropout (inverted dropout: kept values are scaled
// by 1/(1-p) in training, identity in eval), but the mask comes from
// `current_generator(input.device())`: the task stream on the CPU, a generator it seeds elsewhere.
class DropoutImpl : public torch::nn::Cloneable<DropoutImpl> {
 public:
  explicit DropoutImpl(const torch::nn::DropoutOptions& options = {});
  explicit DropoutImpl(double p) : DropoutImpl(torch::nn::DropoutOptions(p)) {}
  void reset() override;
  torch::Tensor forward(torch::Tensor input);
  void pretty_print(std::ostream& stream) const override;

  torch::nn::DropoutOptions options;
};
TORCH_MODULE(Dropout);

}  // namespace pipetrain::runtime

namespace pipetrain::runtime {

// The model with each torch::nn::Dropout child replaced by a
// runtime::Dropout with the same options and mode; other children are shared, not copied.
torch::nn::Sequential convert_dropout(const torch::nn::Sequential& model);

}  // namespace pipetrain::runtime
