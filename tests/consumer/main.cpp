// The library example of docs/gpipe.md (the README shows a shorter one): it must compile
// against the installed package and run.
// A small regression model trained through GPipe: 2 partitions, 4 micro-batches.
#include <pipetrain/pipetrain.h>

#include <iostream>

int main() {
  std::cout << "pipetrain " << PIPETRAIN_VERSION << "\n";
  std::cout << pipetrain::util::describe_blas(pipetrain::util::blas_info()) << "\n";

  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                              torch::nn::Dropout(0.1), torch::nn::Linear(32, 32),
                              torch::nn::ReLU(), torch::nn::Linear(32, 1));
  pipetrain::GPipe gpipe(model, pipetrain::GPipeOptions({3, 3})  // layers per partition
                                    .chunks(4)                   // micro-batches
                                    .checkpoint(pipetrain::Checkpoint::ExceptLast));
  torch::optim::SGD optimizer(gpipe->parameters(), torch::optim::SGDOptions(0.05));

  const torch::Tensor x = torch::randn({64, 16});
  const torch::Tensor y = x.sum(1, /*keepdim=*/true).sin();
  double first = 0, last = 0;
  for (int step = 0; step < 50; ++step) {
    optimizer.zero_grad();
    const torch::Tensor out = gpipe->forward(x);  // on gpipe->devices().back()
    const torch::Tensor loss = torch::mse_loss(out, y.to(gpipe->devices().back()));
    loss.backward();
    optimizer.step();
    last = loss.item<double>();
    if (step == 0) first = last;
    if (step % 10 == 0) std::cout << "step " << step << " loss " << last << "\n";
  }
  std::cout << "loss " << first << " -> " << last << "\n";
  return last < first ? 0 : 1;
}
