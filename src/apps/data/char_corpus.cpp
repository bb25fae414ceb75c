// A character-level text corpus: the fortunes, a byte vocabulary, train/val split, windows.
#include "apps/data/char_corpus.h"

#include <dirent.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "apps/data/rng.h"
#include "pipetrain/error.h"

namespace pipetrain::data {
namespace {

constexpr const char* kInstallFortunes =
    "install the text with `bash scripts/install-deps.sh` (Debian package fortunes) or point "
    "--data-dir / PIPETRAIN_FORTUNES_DIR at a directory of fortune files";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A fortune file: fortunes separated by lines holding a single "%".
void split_fortunes(const std::string& text, std::vector<std::string>& out) {
  std::istringstream in(text);
  std::string line, current;
  auto flush = [&] {
    while (!current.empty() && current.back() == '\n') current.pop_back();
    if (!current.empty()) out.push_back(current);
    current.clear();
  };
  while (std::getline(in, line)) {
    if (line == "%") {
      flush();
    } else {
      current += line;
      current += '\n';
    }
  }
  flush();
}

}  // namespace

std::vector<std::string> read_fortunes(const std::string& dir_arg) {
  std::string dir = dir_arg;
  if (dir.empty()) {
    const char* env = std::getenv("PIPETRAIN_FORTUNES_DIR");
    dir = env && *env ? env : kFortunesDir;
  }
  DIR* d = ::opendir(dir.c_str());
  if (!d) throw DataError(fmt::format("cannot open the fortunes directory {}; {}", dir, kInstallFortunes));
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    if (name.empty() || name[0] == '.' || ends_with(name, ".dat") || ends_with(name, ".u8"))
      continue;
    struct stat st {};
    const std::string path = dir + "/" + name;
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());

  std::vector<std::string> fortunes;
  for (const auto& name : names) {
    std::ifstream in(dir + "/" + name, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    // Old fortunes underline and embolden by overstriking ("_\bx", "x\bx") and carry other
    // control bytes; a model would learn to print them. Keep the last character of an
    // overstrike, newlines and tabs.
    std::string clean;
    for (const char c : text.str()) {
      const auto b = static_cast<uint8_t>(c);
      if (c == '\b') {
        if (!clean.empty() && clean.back() != '\n') clean.pop_back();
      } else if ((b >= 0x20 && b != 0x7f) || c == '\n' || c == '\t') {
        clean.push_back(c);
      }
    }
    split_fortunes(clean, fortunes);
  }
  if (fortunes.empty())
    throw DataError(
        fmt::format("no fortunes found in {} (looked for files without .dat/.u8); {}", dir, kInstallFortunes));
  return fortunes;
}

CharVocab::CharVocab(const std::string& text) {
  std::array<bool, 256> seen{};
  for (const char c : text) seen[static_cast<uint8_t>(c)] = true;
  ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    if (!seen[b]) continue;
    ids_[b] = static_cast<int16_t>(chars_.size());
    chars_.push_back(static_cast<char>(b));
  }
}

torch::Tensor CharVocab::encode(const std::string& text) const {
  auto ids = torch::empty({static_cast<int64_t>(text.size())}, torch::kInt64);
  auto* out = ids.data_ptr<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) {
    const int id = ids_[static_cast<uint8_t>(text[i])];
    if (id < 0)
      throw DataError(
          fmt::format("byte 0x{:02x} at position {} is not in the {}-character "
                      "vocabulary; encode only text from the training corpus",
                      static_cast<uint8_t>(text[i]), i, size()));
    out[i] = id;
  }
  return ids;
}

std::string CharVocab::decode(const torch::Tensor& ids) const {
  const auto flat = ids.to(torch::kInt64).contiguous().view(-1);
  const auto* p = flat.data_ptr<int64_t>();
  std::string text;
  text.reserve(static_cast<size_t>(flat.numel()));
  for (int64_t i = 0; i < flat.numel(); ++i) {
    if (p[i] < 0 || p[i] >= size())
      throw DataError(
          fmt::format("token id {} is outside the vocabulary of {} characters", p[i], size()));
    text.push_back(chars_[static_cast<size_t>(p[i])]);
  }
  return text;
}

CharCorpus make_char_corpus(const std::vector<std::string>& documents, int64_t val_every) {
  if (val_every < 2) throw ConfigError(fmt::format("val_every must be >= 2, got {}", val_every));
  std::string train, val;
  for (size_t i = 0; i < documents.size(); ++i) {
    std::string& out = (static_cast<int64_t>(i) % val_every == val_every - 1) ? val : train;
    out += documents[i];
    out += "\n\n";
  }
  CharCorpus corpus;
  corpus.vocab = CharVocab(train + val);
  corpus.train = corpus.vocab.encode(train);
  corpus.val = corpus.vocab.encode(val);
  return corpus;
}

Windows random_windows(const torch::Tensor& tokens, int64_t length, int64_t batch, uint64_t seed) {
  const int64_t n = tokens.numel();
  if (length < 1 || batch < 1 || n < length + 1)
    throw ConfigError(fmt::format("cannot cut {} windows of {} + 1 tokens from a text of {} tokens",
                                  batch, length, n));
  Rng rng(seed);
  auto starts = torch::empty({batch, 1}, torch::kInt64);
  auto* start = starts.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b)
    start[b] = static_cast<int64_t>(rng.below(static_cast<uint64_t>(n - length)));
  const auto offsets = torch::arange(length + 1, torch::kInt64).unsqueeze(0);
  const auto rows = tokens.index({(starts + offsets).view(-1)}).view({batch, length + 1});
  return {rows.slice(1, 0, length).contiguous(), rows.slice(1, 1, length + 1).contiguous()};
}

int64_t count_windows(const torch::Tensor& tokens, int64_t length) {
  return length < 1 ? 0 : std::max<int64_t>(0, (tokens.numel() - 1) / length);
}

Windows consecutive_windows(const torch::Tensor& tokens, int64_t length, int64_t first,
                            int64_t batch) {
  const int64_t total = count_windows(tokens, length);
  const int64_t end = std::min(first + batch, total);
  if (first < 0 || first >= end)
    throw ConfigError(fmt::format("windows [{}, {}) are outside the {} windows of length {}", first,
                                  first + batch, total, length));
  const int64_t rows = end - first;
  const auto span = tokens.slice(0, first * length, end * length + 1);
  const auto inputs = span.slice(0, 0, rows * length).view({rows, length});
  const auto targets = span.slice(0, 1, rows * length + 1).view({rows, length});
  return {inputs.contiguous(), targets.contiguous()};
}

}  // namespace pipetrain::data
