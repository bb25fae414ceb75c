// The character corpus: fortune files, byte vocabulary, split, windows.
#include "apps/data/char_corpus.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "data_test_util.h"
#include "pipetrain/error.h"

namespace pipetrain::data {
namespace {

using ::testing::HasSubstr;

TEST(CharVocab, SortedBytesRoundTrip) {
  const CharVocab vocab("hello, world\n");
  EXPECT_EQ(vocab.chars(), std::string("\n ,dehlorw"));
  const auto ids = vocab.encode("hold");
  EXPECT_EQ(ids.dtype(), torch::kInt64);
  EXPECT_EQ(vocab.decode(ids), "hold");
  EXPECT_THROW(vocab.encode("hex"), DataError);
  EXPECT_THROW(vocab.decode(torch::tensor({int64_t{99}})), DataError);
}

TEST(Fortunes, SplitsFilesOnPercentLinesAndSkipsIndexes) {
  const auto dir = pipetrain::testing::scratch_dir("fortunes");
  std::ofstream(dir + "/b") << "second file\n%\nlast one\n";
  std::ofstream(dir + "/a") << "first\nfortune\n%\nanother\n%\n";
  std::ofstream(dir + "/a.dat") << "binary index";
  std::ofstream(dir + "/c") << "_\bb_\bo\x1b[1mld\x7f\tend\n";
  const auto fortunes = read_fortunes(dir);
  EXPECT_EQ(fortunes, (std::vector<std::string>{"first\nfortune", "another", "second file",
                                                "last one", "bo[1mld\tend"}));
  const auto empty = pipetrain::testing::scratch_dir("fortunes_empty");
  EXPECT_THROW(read_fortunes(empty), DataError);
  try {
    read_fortunes("/nonexistent/fortunes");
    FAIL();
  } catch (const DataError& e) {
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/fortunes"));
    EXPECT_THAT(e.what(), HasSubstr("bash scripts/install-deps.sh"));
  }
}

TEST(CharCorpus, EveryTenthFortuneIsValidation) {
  std::vector<std::string> docs;
  for (int i = 0; i < 20; ++i) docs.push_back(std::string(1, static_cast<char>('a' + i)));
  const CharCorpus c = make_char_corpus(docs, 10);
  EXPECT_EQ(c.vocab.decode(c.val), "j\n\nt\n\n");
  EXPECT_EQ(c.train.numel() + c.val.numel(), 60);
}

TEST(Windows, TargetsAreInputsShiftedByOne) {
  const auto tokens = torch::arange(100, torch::kInt64);
  const Windows w = random_windows(tokens, 8, 5, 3);
  EXPECT_EQ(w.inputs.sizes(), (std::vector<int64_t>{5, 8}));
  EXPECT_TRUE(torch::equal(w.targets, w.inputs + 1));
  EXPECT_TRUE(torch::equal(w.inputs, random_windows(tokens, 8, 5, 3).inputs));
  EXPECT_FALSE(torch::equal(w.inputs, random_windows(tokens, 8, 5, 4).inputs));
  EXPECT_LE(w.targets.max().item<int64_t>(), 99);
  EXPECT_THROW(random_windows(tokens, 100, 1, 0), ConfigError);

  EXPECT_EQ(count_windows(tokens, 8), 12);  // 12 x 8 + 1 <= 100
  const Windows c = consecutive_windows(tokens, 8, 10, 5);
  EXPECT_EQ(c.inputs.size(0), 2);
  EXPECT_EQ(c.inputs[0][0].item<int64_t>(), 80);
  EXPECT_TRUE(torch::equal(c.targets, c.inputs + 1));
  EXPECT_THROW(consecutive_windows(tokens, 8, 12, 1), ConfigError);
}

TEST(Fortunes, ThePackagedText) {
  std::vector<std::string> fortunes;
  try {
    fortunes = read_fortunes();
  } catch (const DataError& e) {
    GTEST_SKIP() << e.what();
  }
  EXPECT_GT(fortunes.size(), 1000u);
  const CharCorpus c = make_char_corpus(fortunes);
  EXPECT_GT(c.train.numel(), 1000000);
  EXPECT_GT(c.val.numel(), c.train.numel() / 20);
  EXPECT_LT(c.vocab.size(), 256);
  EXPECT_TRUE(c.vocab.contains('e'));
}

}  // namespace
}  // namespace pipetrain::data
