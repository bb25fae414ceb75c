// Text generation from a character-level language model held in one process.
#pragma once

#include <string>

#include "apps/data/char_corpus.h"
#include "apps/examples/example.h"

namespace pipetrain::examples {

// Feeds the prompt (or "\n") through all layers of `model` (token ids [1, t] -> logits
// [1, t, V]) and appends `options.length()` characters, each drawn from the last position's
// softmax(logits / temperature) with a SplitMix64 stream seeded by `options.seed()`, or its
// argmax when the temperature is 0. Inputs are cropped to the last `context` tokens. Runs
// without gradients and in evaluation mode, restoring the training mode afterwards. Returns
// the generated characters without the prompt. DataError for a prompt character outside the
// vocabulary.
std::string generate_text(BuiltLayers& model, const data::CharVocab& vocab, int64_t context,
                          const SampleOptions& options);

}  // namespace pipetrain::examples
