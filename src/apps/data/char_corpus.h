// A character-level text corpus: the fortunes, a byte vocabulary, train/val split, windows.
#pragma once

#include <torch/torch.h>

#include <array>
#include <string>
#include <vector>

namespace pipetrain::data {

// Where the Debian package `fortunes` puts its text files; PIPETRAIN_FORTUNES_DIR overrides.
inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// The fortunes of every plain text file in `dir` (or PIPETRAIN_FORTUNES_DIR, or
// kFortunesDir), in file-name order, each without its "%" separator line. The ".dat" indexes
// and ".u8" links are skipped; an overstrike ("_\bx") keeps its last character and other control
// bytes than newline and tab are dropped. DataError naming the directory and the fix when there are
// none.
std::vector<std::string> read_fortunes(const std::string& dir = "");

// The distinct bytes of a text, sorted; token id = position. Bytes, not code points: the few
// UTF-8 sequences in the corpus become several tokens, and every text round-trips.
class CharVocab {
 public:
  CharVocab() = default;
  explicit CharVocab(const std::string& text);

  int64_t size() const { return static_cast<int64_t>(chars_.size()); }
  const std::string& chars() const { return chars_; }
  bool contains(char c) const { return ids_[static_cast<uint8_t>(c)] >= 0; }
  // [len] int64; a byte outside the vocabulary is a DataError naming it.
  torch::Tensor encode(const std::string& text) const;
  // Any integer tensor of ids, flattened; an id outside the vocabulary is a DataError.
  std::string decode(const torch::Tensor& ids) const;

 private:
  std::string chars_;
  std::array<int16_t, 256> ids_{};
};

// Fortunes joined by blank lines and encoded; every `val_every`-th fortune (the last of each
// group) goes to the validation text, so both splits sample every file.
struct CharCorpus {
  CharVocab vocab;
  torch::Tensor train;  // [n_train] int64 token ids
  torch::Tensor val;    // [n_val] int64
};
CharCorpus make_char_corpus(const std::vector<std::string>& documents, int64_t val_every = 10);

// A language-modelling batch: targets are the inputs shifted by one position.
struct Windows {
  torch::Tensor inputs;   // [B, T] int64
  torch::Tensor targets;  // [B, T] int64
};
// B windows of T + 1 tokens at start positions drawn from `seed` (uniform over the valid
// starts). ConfigError when the text is shorter than T + 1 tokens.
Windows random_windows(const torch::Tensor& tokens, int64_t length, int64_t batch, uint64_t seed);
// Consecutive non-overlapping windows from the start: windows [first, first + batch), fewer
// at the end; `count_windows` says how many fit.
int64_t count_windows(const torch::Tensor& tokens, int64_t length);
Windows consecutive_windows(const torch::Tensor& tokens, int64_t length, int64_t first,
                            int64_t batch);

}  // namespace pipetrain::data
