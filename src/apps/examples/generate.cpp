// Text generation from a character-level language model held in one process.
#include "apps/examples/generate.h"

#include <fmt/format.h>

#include "apps/data/rng.h"
#include "pipetrain/error.h"

namespace pipetrain::examples {

std::string generate_text(BuiltLayers& model, const data::CharVocab& vocab, int64_t context,
                          const SampleOptions& options) {
  if (options.temperature() < 0)
    throw ConfigError(fmt::format("temperature must be >= 0, got {}", options.temperature()));
  const std::string prompt = options.prompt().empty() ? "\n" : options.prompt();
  std::vector<int64_t> tokens;
  {
    const auto ids = vocab.encode(prompt);
    tokens.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
  }
  const bool was_training = !model.modules.empty() && model.modules.front().ptr()->is_training();
  set_training(model, false);
  torch::NoGradGuard no_grad;
  data::Rng rng(options.seed());
  std::string out;
  for (int64_t n = 0; n < options.length(); ++n) {
    const size_t begin = tokens.size() > static_cast<size_t>(context) ? tokens.size() - context : 0;
    auto input =
        torch::tensor(std::vector<int64_t>(tokens.begin() + begin, tokens.end()), torch::kInt64)
            .unsqueeze(0);
    const auto logits = model.forward(input).tensor()[0][-1].to(torch::kFloat64);
    int64_t next = 0;
    if (options.temperature() == 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      const auto probs = torch::softmax(logits / options.temperature(), 0).contiguous();
      const double* p = probs.data_ptr<double>();
      // Inverse CDF of a uniform draw with 53 random bits.
      const double u = static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
      double cumulative = 0;
      next = probs.numel() - 1;
      for (int64_t i = 0; i < probs.numel(); ++i) {
        cumulative += p[i];
        if (u < cumulative) {
          next = i;
          break;
        }
      }
    }
    tokens.push_back(next);
    out += vocab.chars()[static_cast<size_t>(next)];
  }
  set_training(model, was_training);
  return out;
}

}  // namespace pipetrain::examples
